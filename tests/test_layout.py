"""The layout stays legible (issue 32): few modules directly in the package, none over 500
lines, and no function longer than a screen in the core, the simulator, the service or the API."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "gpupool"
MODULES_AT_THE_TOP = 12
MODULE_LINES = 500
FUNCTION_LINES = 60
SHORT_FUNCTIONS_IN = ("policy", "sim", "service", "api")


def too_long() -> set[str]:
    """Modules over `MODULE_LINES` lines, and functions over `FUNCTION_LINES` in
    `SHORT_FUNCTIONS_IN`, as `path` and `path:function` under src/gpupool."""
    found = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        source = path.read_text()
        if len(source.splitlines()) > MODULE_LINES:
            found.add(name)
        if name.split("/")[0] not in SHORT_FUNCTIONS_IN:
            continue
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                if node.end_lineno - node.lineno + 1 > FUNCTION_LINES:
                    found.add(f"{name}:{node.name}")
    return found


def test_at_most_twelve_modules_directly_in_the_package() -> None:
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= MODULES_AT_THE_TOP, top


def test_no_module_over_500_lines_and_no_function_over_60_in_the_core_simulator_service_and_api() -> None:
    assert too_long() == set()
