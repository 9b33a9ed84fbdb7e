"""Render the container recipe (docker/Dockerfile) from the stack manifest, orchestrator/core/stack.py.

    python scripts/image.py           # write docker/Dockerfile
    python scripts/image.py --check   # exit 1 when the committed file is not the manifest's rendering

Why generated: preflight and the image read one list (the manifest), so a component cannot be checked on the
node without being installed by the recipe, nor pinned at two versions. tests/job/test_stack.py runs --check.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.core import stack  # noqa: E402 - after the checkout is on sys.path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args(argv)
    path = ROOT / stack.RECIPE
    text = stack.dockerfile()
    if args.check:
        if not path.is_file() or path.read_text() != text:
            print(
                f"error: {stack.RECIPE} is not the manifest's rendering: run `python scripts/image.py`", file=sys.stderr
            )
            return 1
        print(f"{stack.RECIPE} is the manifest's rendering")
        return 0
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print(f"wrote {stack.RECIPE} ({len(stack.COMPONENTS)} components, base {stack.BASE_IMAGE})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
