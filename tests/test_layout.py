"""The package's shape: importing any module starts nothing, and offline readers stay offline.

Each check runs in a fresh interpreter, so what it finds in sys.modules is what the imports
named here pulled in, not what other tests loaded before."""

from __future__ import annotations

import functools
import importlib.util
import subprocess
import sys

import pytest

IMPORT_S = 30.0

WALK = """
import importlib, pkgutil, socket, sys

def refuse(sock, address):
    raise AssertionError(f"a module bound {address} while being imported")

socket.socket.bind = refuse  # every listener, asyncio's included, binds through this
import curb

skipped = []
for info in pkgutil.walk_packages(curb.__path__, "curb.", onerror=skipped.append):
    try:
        importlib.import_module(info.name)
    except ModuleNotFoundError as err:  # an optional extra (Spark) that is not installed
        if err.name is None or err.name.startswith("curb"):
            raise
        skipped.append(info.name)
print(" ".join(skipped))
"""


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=IMPORT_S, stdin=subprocess.DEVNULL
    )


def test_walking_the_package_imports_every_module_without_starting_anything():
    """pydoc, Sphinx autodoc and pkgutil.walk_packages import every module: `curb/__main__.py`
    must not start a broker then (it used to, and blocked on port 61613)."""
    result = run_python(WALK)
    assert result.returncode == 0, result.stderr
    if importlib.util.find_spec("pyspark") is not None:
        assert result.stdout.strip() == "", f"modules not imported: {result.stdout}"


@pytest.mark.parametrize(
    ("module", "absent"),
    [
        ("curb.inspect", ("curb.log.core", "curb.server", "asyncio")),
        ("curb.spark.logfile", ("curb.log.core", "curb.server")),
    ],
)
def test_offline_readers_import_only_the_file_format_modules(module, absent):
    """`curb inspect` and Spark's log-file reader read files: the broker's asyncio log
    (and its threads) has no business in their process, though they import the file-format
    modules from the same package (`curb.log`)."""
    if module.startswith("curb.spark") and importlib.util.find_spec("pyspark") is None:
        pytest.skip("the Spark extra is not installed")
    result = run_python(f"import sys, {module}\nprint(' '.join(sorted(sys.modules)))")
    assert result.returncode == 0, result.stderr
    loaded = set(result.stdout.split())
    assert "curb.log.scan" in loaded
    assert not loaded & set(absent), f"importing {module} loaded {sorted(loaded & set(absent))}"


def test_the_code_map_names_every_module():
    """ARCHITECTURE.md's "Code map" promises one line per module: a module added without
    its line fails here."""
    from pathlib import Path

    top = Path(__file__).resolve().parent.parent
    architecture = (top / "ARCHITECTURE.md").read_text()
    code_map = architecture[architecture.index("\n## Code map\n") :].split("\n## ", 2)[1]
    package = top / "curb"
    missing = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(top).as_posix()
        in_subpackage = path.parent != package and f"`{path.parent.relative_to(top).as_posix()}/`" in code_map
        if f"`{relative}`" not in code_map and not (in_subpackage and f"`{path.name}`" in code_map):
            missing.append(relative)
    assert not missing, f"modules without a line in ARCHITECTURE.md's Code map: {missing}"


def test_the_log_package_names_resolve_where_they_are_defined():
    """`from curb.log import Log, ...` loads each name from its module on first use: every
    name the package lists resolves, to the object its module defines."""
    result = run_python(
        "import importlib, curb.log as log\n"
        "assert sorted(log.__all__) == sorted(log.HOMES), 'a public name without its module'\n"
        "for name, home in log.HOMES.items():\n"
        "    assert getattr(log, name) is getattr(importlib.import_module('curb.log.' + home), name), name\n"
        "try:\n"
        "    log.Nothing\n"
        "except AttributeError as err:\n"
        "    print(err)\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "module 'curb.log' has no attribute 'Nothing'"


@pytest.mark.parametrize(
    ("module", "forbidden"),
    [
        ("broker", {"curb.session", "curb.server", "curb.instance", "curb.cli"}),
        ("session", {"curb.server", "curb.instance", "curb.cli", "asyncio", "socket"}),
        ("queue", {"curb.session", "curb.broker", "curb.log", "asyncio", "socket"}),
        *[
            (unit, {"curb.server", "curb.driver", "curb.instance", "asyncio", "socket", "time"})
            for unit in ("commands", "access", "receipts", "render", "output", "deadlines")
        ],
    ],
)
def test_the_layers_import_only_downwards(module, forbidden):
    """Every import, the type checker's too: the broker calls connections back through its
    Peer protocol and names no session (they once imported each other), and the session
    rules and the queue name no transport."""
    import ast
    from pathlib import Path

    source = (Path(__file__).resolve().parent.parent / "curb" / f"{module}.py").read_text()
    named = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            named |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            named |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    assert not named & forbidden, f"curb/{module}.py imports {sorted(named & forbidden)}"


@functools.cache
def import_graph() -> dict[str, set[str]]:
    """Every curb module and the curb modules it imports: every import, those inside
    functions and those only the type checker reads included. A module written in C
    counts as its stub (.pyi), which imports nothing."""
    import ast
    from pathlib import Path

    top = Path(__file__).resolve().parent.parent
    modules: dict[str, Path] = {}
    for path in [*(top / "curb").rglob("*.py"), *(top / "curb").rglob("*.pyi")]:
        parts = list(path.relative_to(top).with_suffix("").parts)
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

    def home(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        named: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                named |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                package = modules.get(node.module, path).name == "__init__.py" and node.module in modules
                named |= {f"{node.module}.{a.name}" for a in node.names} if package else {node.module}
        graph[module] = {h for n in named if n.startswith("curb") and (h := home(n)) and h != module}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: strongly connected sets of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in sorted(graph[module]):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            part = []
            while True:
                other = stack.pop()
                part.append(other)
                if other == module:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def test_no_module_of_curb_is_in_an_import_circle():
    """The units import one way: a circle (the session and its rules once were one, the
    HTTP API and its WebSocket protocols another) fails here, naming its modules."""
    assert circles(import_graph()) == []


def test_the_circle_finder_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# Each package (or ground-floor module) and the curb modules it must never import: a
# lower floor never names a higher one, and the fronts on top never name each other.
SERVING = ("curb.broker", "curb.session", "curb.server", "curb.driver", "curb.instance", "curb.cli")
FRONTS = ("curb.web", "curb.router", "curb.spark")
ABOVE = {
    "curb.log": (*SERVING, *FRONTS, "curb.queue", "curb.users"),
    "curb.users": (*SERVING, *FRONTS, "curb.log"),
    "curb.spark": (*SERVING, "curb.web", "curb.router", "curb.log.core", "curb.log.driver"),
    "curb.web": ("curb.router", "curb.spark", "curb.instance", "curb.cli"),
    "curb.router": ("curb.web", "curb.spark", "curb.cli"),
    "curb.queue": (*SERVING, "curb.log", *FRONTS),
}
# The modules that wire one front to another, and the fronts each may name: the router's
# web front (curb.router.web, loaded only with -http) is the broker's, wired to the router's
# core, as curb.instance wires it to a broker. curb.web still never names the router.
WIRING = {"curb.router.web": ("curb.web",)}


@pytest.mark.parametrize("package", sorted(ABOVE))
def test_every_package_imports_only_downwards(package):
    graph = import_graph()
    wrong = {
        f"{module} -> {other}"
        for module, imports in graph.items()
        if module == package or module.startswith(package + ".")
        for other in imports
        if any(other == high or other.startswith(high + ".") for high in ABOVE[package])
        and not any(other == wired or other.startswith(wired + ".") for wired in WIRING.get(module, ()))
    }
    assert not wrong, f"imports up from {package}: {sorted(wrong)}"


def test_no_module_imports_another_packages_private_names():
    """A name with a leading underscore is its module's own: another package that needs
    it needs it made public, where both can see it."""
    import ast
    from pathlib import Path

    top = Path(__file__).resolve().parent.parent
    wrong = []
    for path in (top / "curb").rglob("*.py"):
        package = path.parent.relative_to(top).as_posix().replace("/", ".")
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or not node.module or not node.module.startswith("curb"):
                continue
            if node.module.rpartition(".")[0] != package and node.module != package:
                wrong += [
                    f"{path.relative_to(top)}: {node.module}.{a.name}"
                    for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")
                ]
    assert not wrong, f"private names imported across packages: {wrong}"


@pytest.mark.parametrize(
    ("path", "name", "most"),
    [("log/core.py", "LogCore", 450), ("broker.py", "Broker", 400), ("router/core.py", "RouterCore", 400)],
)
def test_the_coordinators_stay_small(path, name, most):
    """The log core and the broker tie units together and do little else: a job that
    grows in them belongs in a unit of its own (their docstrings name the units)."""
    import ast
    from pathlib import Path

    source = (Path(__file__).resolve().parent.parent / "curb" / path).read_text()
    [node] = [n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == name]
    assert node.end_lineno is not None
    lines = node.end_lineno - node.lineno + 1
    assert lines < most, f"{name} is {lines} lines; move a job out to a unit of its own"
