"""Run every benchmark in bench/ one after another (`make bench`); each prints its own table."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path


def main() -> int:
    """Run each bench module as __main__; report which failed."""
    failed = []
    for path in sorted(Path(__file__).parent.glob("bench_*.py")):
        name = f"bench.{path.stem}"
        print(f"\n=== {name}  (reproduce: .venv/bin/python -m {name})", flush=True)
        try:
            runpy.run_module(name, run_name="__main__")
        except SystemExit as exc:
            if exc.code not in (0, None):
                failed.append(name)
        except Exception as exc:  # noqa: BLE001 - keep going, report at the end
            print(f"{name} failed: {exc!r}", file=sys.stderr)
            failed.append(name)
    if failed:
        print(f"failed: {failed}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
