"""Benchmarks and harnesses, each a module run from the repository root:
`.venv/bin/python -m benchmarks.NAME` (see each module's docstring)."""
