"""A long property-based fuzz of the whole API from its OpenAPI document (schemathesis), the
suite's tests/api/test_fuzz.py with many more examples: every operation, valid and invalid
input, with the admin token, a team's and a user's, against the ASGI app in-process on a SQLite
store. Prints, per token, the examples, operations, answers by status and every finding (a
server error, or an answer the document does not describe).

Run: .venv/bin/python -m benchmarks.fuzz_api [--examples 500] [--seed N]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from tests.support.apiworld import opened
from tests.support.fuzzing import fuzz, fuzz_world


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=500, help="Per operation and mode (default 500).")
    parser.add_argument("--seed", type=int, default=None, help="Hypothesis seed (default: random).")
    args = parser.parse_args()
    found = 0
    for who in ("admin", "team", "user"):
        with tempfile.TemporaryDirectory() as folder:
            for api in opened(Path(folder)):
                token = fuzz_world(api)[who]
                began = time.monotonic()
                report = fuzz(api.app, token, examples=args.examples, derandomize=False, seed=args.seed)
                print(f"{who}: {report.summary()} in {time.monotonic() - began:.0f} s", flush=True)
                if report.unsatisfiable:
                    print(f"  no input to make for: {', '.join(report.unsatisfiable)}")
                for f in report.findings:
                    print(f"  {f.operation} ({f.mode}) {f.status}: {f.problem}\n    {f.request}")
                found += len(report.findings)
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
