"""What gpupool's tests and benchmarks share, where product code cannot import it (nothing
under src/ may: tests/test_imports.py checks). Imported as `tests.support...` from the
repository root (pytest's `pythonpath`, or `python -m benchmarks.NAME`).

- `builders`: scheduling scenarios in a few words (`pool`, `job`, `running`, `fill`, `summary`).
- `fakes`: an executor without processes (`FakeExecutor`), a small store (`two_node_store`).
- `live`: `gpupool up` as a real process with its command line (`Service`), `wait_for`.
- `apiworld`: the API on a SQLite store with two teams, their users and jobs.
- `fuzzing`: schemathesis over the API's own OpenAPI document.
- `pgserver`: a real PostgreSQL server on loopback.
- `browser`: Debian's headless Chromium, for the dashboard.
- `oracle`: the core's reference, decided from the jobs alone, that every core test compares with.
- `exercised`: what a property test's examples exercised, asserted over its run.
"""
