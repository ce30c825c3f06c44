"""The package's shape: importing any module starts nothing, and offline readers stay offline.

Each check runs in a fresh interpreter, so what it finds in sys.modules is what the imports
named here pulled in, not what other tests loaded before."""

from __future__ import annotations

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
