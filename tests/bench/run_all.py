"""`make bench`: run every tests/bench/bench_*.py file's main() in turn and print their figures.

Why a runner and not pytest: benchmarks print numbers for people (and fail loudly if a goal is
missed); they are not pass/fail unit tests and must not slow `make test`. Exit status: non-zero if
any bench raised or returned a falsy "goal met" value (main() may return True/False or None). A bench that keeps
its worst rows in a module-level WORST ({set: [lines]}, bench_search's) has them repeated at the end, beside the
tally: a mean hides the rows a cluster would wait days on (issue 48 item 7).
"""

from __future__ import annotations

import importlib.util
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


def load(path: Path):
    spec = importlib.util.spec_from_file_location(f"bench_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules[spec.name] = mod  # dataclasses (and pickling) look their module up there
    spec.loader.exec_module(mod)
    return mod


def main(argv=None) -> int:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    names = set(argv or [])
    files = sorted(p for p in HERE.glob("bench_*.py") if not names or p.stem in names)
    failed = []
    worst: dict[str, dict[str, list[str]]] = {}
    for path in files:
        print(f"== {path.stem}", flush=True)
        t0 = time.perf_counter()
        try:
            mod = load(path)
            ok = mod.main()
            if getattr(mod, "WORST", None):
                worst[path.stem] = dict(mod.WORST)
        except Exception:  # noqa: BLE001 - report and continue with the next bench
            traceback.print_exc()
            ok = False
        print(f"   ({path.stem}: {time.perf_counter() - t0:.1f} s wall)", flush=True)
        if ok is False:
            failed.append(path.stem)
    for stem, sets in worst.items():
        for name, lines in sets.items():
            print(f"== {stem}: worst rows, {name}")
            for line in lines:
                print(f"   {line}")
    print(f"== {len(files)} benches, {len(failed)} missed their goal" + (f": {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
