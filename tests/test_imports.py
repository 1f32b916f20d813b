"""The arrows of the layout point one way (docs/layout.md): no module of gpupool
imports itself through others, and each layer imports only what it may.

Two kinds of check. Static ones read every module's imports from its source (`imports()`: at
module level, under `if TYPE_CHECKING:`, and inside functions), so that a failure names the
file, the line and the import. Others import a module in a fresh interpreter and list what it
loaded (`loaded_by`): what a user of that layer really pays for.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


@dataclass(frozen=True)
class Import:
    importer: str
    target: str
    """The gpupool module imported (the longest that exists), or the top-level name of another."""
    path: Path
    line: int
    when: str
    """`module` (run when the importer loads), `type-checking` or `function` (run when called)."""

    def __str__(self) -> str:
        where = "" if self.when == "module" else f" ({self.when})"
        return f"{self.path.relative_to(SRC.parent)}:{self.line}: {self.importer} imports {self.target}{where}"


@cache
def modules() -> dict[str, Path]:
    """Every module of gpupool by name (a package by its `__init__.py`)."""
    found = {}
    for path in sorted((SRC / "gpupool").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def named(name: str) -> str:
    """A gpupool module named by an import (`gpupool.a.b.Thing` is `gpupool.a.b`), else the
    top-level name of the package imported."""
    if not name.startswith("gpupool"):
        return name.split(".", maxsplit=1)[0]
    while name not in modules():
        name = name.rpartition(".")[0]
    return name


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def statements(body: Iterable[ast.stmt], when: str) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
    """Each import statement of a body, with when it runs."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, when
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield from statements(node.body, "function")
        elif isinstance(node, ast.If):
            inner = "type-checking" if is_type_checking(node.test) else when
            yield from statements(node.body, inner)
            yield from statements(node.orelse, when)
        else:
            # Classes, `try`, `with`, loops: their bodies run when the module loads.
            for field in ("body", "orelse", "finalbody"):
                yield from statements(getattr(node, field, []), when)
            for handler in getattr(node, "handlers", []):
                yield from statements(handler.body, when)


@cache
def imports() -> tuple[Import, ...]:
    found = []
    for importer, path in modules().items():
        package = importer if path.name == "__init__.py" else importer.rpartition(".")[0]
        for node, when in statements(ast.parse(path.read_text()).body, "module"):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                names = [f"{base}.{alias.name}" for alias in node.names]
            for name in names:
                target = named(name)
                if target != importer:
                    found.append(Import(importer, target, path, node.lineno, when))
    return tuple(found)


def inside(module: str, *prefixes: str) -> bool:
    """Whether `module` is one of `prefixes` or in one of those packages."""
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def beyond(layer: str, allowed: Iterable[str]) -> list[str]:
    """The imports by modules of `layer` of gpupool modules outside `allowed` (and `layer`)."""
    allowed = (layer, *allowed)
    return [
        str(i)
        for i in imports()
        if inside(i.importer, layer) and i.target.startswith("gpupool.") and not inside(i.target, *allowed)
    ]


def offending(layer: str, forbidden: Iterable[str], *, allowed: Iterable[str] = ()) -> list[str]:
    """The imports by modules of `layer` of anything in `forbidden`, but those in `allowed`."""
    forbidden, allowed = tuple(forbidden), tuple(allowed)
    return [
        str(i)
        for i in imports()
        if inside(i.importer, layer) and inside(i.target, *forbidden) and not inside(i.target, *allowed)
    ]


def assert_none(found: list[str]) -> None:
    """Fail naming every offending import, one a line."""
    assert not found, "imports against the layout:\n" + "\n".join(dict.fromkeys(found))


GPUPOOL_LAYERS = (
    "gpupool.policy",
    "gpupool.sim",
    "gpupool.store",
    "gpupool.service",
    "gpupool.executors",
    "gpupool.telemetry",
    "gpupool.api",
    "gpupool.cli",
    "gpupool.demo",
    "gpupool.up",
)
"""gpupool's packages above the vocabulary (model, units, errors, config, settle, accounting, ...)."""


# --- no cycle -----------------------------------------------------------------------------------


def cycles(edges: Iterable[tuple[str, str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_of_gpupool_imports_itself_through_others() -> None:
    """Over the imports that run when a module loads, and those under TYPE_CHECKING (a type that
    needs a cycle is a design that does)."""
    edges = {(i.importer, i.target) for i in imports() if i.when != "function" and i.target.startswith("gpupool")}
    found = cycles(edges)
    shown = [
        "a cycle among "
        + ", ".join(c)
        + "\n    "
        + "\n    ".join(dict.fromkeys(str(i) for i in imports() if i.importer in c and i.target in c))
        for c in found
    ]
    assert not found, "import cycles:\n" + "\n".join(shown)


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles([("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")]) == [["a", "b", "c"]]
    assert cycles([("a", "b"), ("b", "c")]) == []


def test_the_vocabulary_names_nothing_of_the_core() -> None:
    assert_none(offending("gpupool.model", ["gpupool.policy"]))


# --- each layer, what it may import --------------------------------------------------------------


def test_the_core_imports_only_the_vocabulary() -> None:
    """`policy` decides on the state its drivers keep: it knows the vocabulary (`model`,
    `shapes`, `units`), nothing of who drives it."""
    assert_none(beyond("gpupool.policy", ["gpupool.model", "gpupool.shapes", "gpupool.units"]))


def test_the_simulator_imports_no_store_service_api_command_line_executor_or_demo() -> None:
    """The simulator drives the core on a virtual clock; it shares the core, the vocabulary and
    the accounting with the service, nothing of the service itself."""
    forbidden = [layer for layer in GPUPOOL_LAYERS if layer not in ("gpupool.policy", "gpupool.sim")]
    assert_none(offending("gpupool.sim", forbidden))
    third_party = [
        str(i) for i in imports() if inside(i.importer, "gpupool.sim") and i.target in ("sqlalchemy", "fastapi")
    ]
    assert_none(third_party)
    ray = [
        str(i) for i in imports() if inside(i.importer, "gpupool.sim") and i.target == "ray" and i.when != "function"
    ]
    assert_none(ray)  # the sweep on a Ray cluster imports Ray when it runs, not when the simulator loads


def test_the_store_imports_no_core_simulator_service_api_command_line_executor_or_demo() -> None:
    """The store keeps the vocabulary's state; it reads the accounting, not the policy that made it."""
    forbidden = [layer for layer in GPUPOOL_LAYERS if layer != "gpupool.store"]
    assert_none(offending("gpupool.store", forbidden))


def test_the_executors_import_only_the_vocabulary() -> None:
    """An executor knows processes and machines, not policy nor where decisions are kept: of
    gpupool, only the vocabulary (`model`, `units`, `errors`, `settle` for what an attempt used)
    and the executors' own modules.
    Ray is imported in `executors/ray/` only: the local executor runs without it."""
    assert_none(beyond("gpupool.executors", ["gpupool.model", "gpupool.units", "gpupool.errors", "gpupool.settle"]))
    ray = [
        str(i)
        for i in imports()
        if i.target == "ray" and not inside(i.importer, "gpupool.executors.ray", "gpupool.sim.on_ray")
    ]
    assert_none(ray)


def test_the_service_imports_no_api_command_line_or_demo() -> None:
    """The service (the control loop and what it keeps) sits under the API: `gpupool.up` puts
    the two together, the service never reaches up."""
    assert_none(offending("gpupool.service", ["gpupool.api", "gpupool.cli", "gpupool.demo", "gpupool.up"]))


def test_the_api_reaches_the_service_only_through_its_interface_and_workspace() -> None:
    """The API holds a `service.interface.Service` and builds paths with `service.workspace`;
    it never imports the control loop, its snapshots, its launches or its lease."""
    allowed = ["gpupool.service.interface", "gpupool.service.workspace"]
    assert_none(offending("gpupool.api", ["gpupool.service"], allowed=allowed))
    forbidden = ["gpupool.cli", "gpupool.demo", "gpupool.up", "gpupool.executors", "gpupool.sim"]
    assert_none(offending("gpupool.api", forbidden))


def test_nothing_imports_the_command_line_the_api_the_demos_or_the_tests() -> None:
    """The top of the stack: the command line is imported by `python -m gpupool` only; the API
    by `gpupool.up`, which assembles the service; the demos by the command that runs them;
    the tests and benchmarks by nothing in the product."""
    wrong = [
        str(i)
        for i in imports()
        if (inside(i.target, "gpupool.cli") and not inside(i.importer, "gpupool.cli", "gpupool.__main__"))
        or (inside(i.target, "gpupool.api") and not inside(i.importer, "gpupool.api", "gpupool.up"))
        or (inside(i.target, "gpupool.demo") and not inside(i.importer, "gpupool.demo", "gpupool.cli.demo"))
        or (inside(i.target, "gpupool.up") and not inside(i.importer, "gpupool.cli", "gpupool.demo"))
        or i.target in ("tests", "benchmarks")
    ]
    assert_none(wrong)


def test_the_static_reading_finds_each_kind_of_import() -> None:
    """The rules above are only as good as the reading: it sees imports at module level, under
    TYPE_CHECKING and in functions, with the module they name."""
    found = {(i.importer, i.target, i.when) for i in imports()}
    assert ("gpupool.service.loop", "gpupool.policy", "module") in found
    assert ("gpupool.executors", "gpupool.executors.users", "type-checking") in found
    assert ("gpupool.cli.demo", "gpupool.demo.live", "function") in found
    assert ("gpupool.up", "gpupool.executors.ray.executor", "function") in found


# --- what a layer loads ---------------------------------------------------------------------------


def loaded_by(module: str) -> list[str]:
    code = f"import sys, json, {module}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    modules: list[str] = json.loads(out)
    return modules


def test_the_core_imports_only_the_vocabulary_the_standard_library_and_numpy() -> None:
    """numpy is arithmetic on arrays, no clock and no I/O: the victim search's bounds are
    worked out with it (policy/preempt/bounds.py). Nothing else from outside comes in."""
    modules = loaded_by("gpupool.policy")
    ours = {m for m in modules if m.startswith("gpupool")}
    vocabulary = {"gpupool", "gpupool.model", "gpupool.shapes", "gpupool.units"}
    assert ours <= vocabulary | {m for m in ours if m.startswith("gpupool.policy")}
    third_party = {"rich", "typer", "yaml", "pydantic", "matplotlib", "sqlalchemy", "fastapi", "ray", "httpx"}
    assert not third_party & {m.split(".")[0] for m in modules}


def test_the_simulator_loads_no_service_or_cluster_engine() -> None:
    modules = {m.split(".")[0] for m in loaded_by("gpupool.sim.replay")}
    assert not {"sqlalchemy", "fastapi", "ray", "matplotlib"} & modules


def test_the_api_loads_no_control_loop() -> None:
    modules = set(loaded_by("gpupool.api"))
    loop = {"gpupool.service.loop", "gpupool.service.snapshots", "gpupool.service.launches", "gpupool.service.leader"}
    assert not loop & modules
    assert not {m for m in modules if inside(m, "gpupool.cli", "gpupool.demo", "gpupool.up", "gpupool.sim")}


def test_the_local_executor_loads_no_ray() -> None:
    modules = {m.split(".")[0] for m in loaded_by("gpupool.executors.local")} | {
        m.split(".")[0] for m in loaded_by("gpupool.up")
    }
    assert "ray" not in modules


def test_the_command_line_loads_no_store_service_or_cluster_engine() -> None:
    """`gpupool --help`, `queue` or `submit` start fast: the service's engines load with
    `gpupool up` and the demos, when they run."""
    modules = {m.split(".")[0] for m in loaded_by("gpupool.cli")}
    assert not {"sqlalchemy", "fastapi", "uvicorn", "ray", "torch", "matplotlib"} & modules
