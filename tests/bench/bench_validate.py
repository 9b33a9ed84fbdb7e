"""The planner against NVIDIA's published Megatron-Bridge MoE measurements (`python -m orchestrator validate`).

Prints every row (predicted against measured tokens/s/GPU and model TFLOP/s/GPU, the uncalibrated and the
per-system calibrated error, NVIDIA's layout's rank among the row's legal layouts) and the goal's figures:
median |error| <= 10% uncalibrated and <= 5% calibrated, on the held-out rows too (25.09 and the releases
after 26.02, each printed apart); no row off by more than 25%; NVIDIA's layout in the planner's top 5% of legal
layouts on every row, or the reason named.
docs/validate.md says what each figure means and why the misses miss.
"""

from __future__ import annotations


def main() -> bool:
    from orchestrator.commands.validate import table, validate

    results, summary = validate()
    print("\n".join("   " + line for line in table(results, summary).splitlines()))
    return all(summary.goals().values())


if __name__ == "__main__":
    raise SystemExit(0 if main() else 1)
