"""The wheel carries the units and the console script, and installs into a clean venv."""

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

import curb
from curb.compiled import build

SOURCE = Path(__file__).resolve().parent.parent
UNIT_FILES = ("curb@.service", "curb@.socket", "curb.env.example")

pytestmark = pytest.mark.slow


def run(*command, cwd: Path, timeout: float = 300) -> str:
    result = subprocess.run([str(c) for c in command], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{command} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built by `pip wheel` from a copy of the source, so the checkout gets no build droppings."""
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(SOURCE / name, source)
    shutil.copytree(SOURCE / "curb", source / "curb", ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so"))
    out = tmp_path_factory.mktemp("wheel")
    run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", out, source, cwd=source)
    [built] = out.glob("curb-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A fresh virtual environment with only the wheel and its dependencies installed."""
    where = tmp_path_factory.mktemp("venv")
    run(sys.executable, "-m", "venv", "--without-pip", where, cwd=where)
    run(
        sys.executable,
        "-m",
        "pip",
        "--python",
        where / "bin" / "python",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        wheel,
        cwd=where,
    )
    return where


def test_wheel_holds_the_unit_files_and_the_console_script(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        [entry_points] = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        scripts = archive.read(entry_points).decode()
    assert {f"curb/units/{unit}" for unit in UNIT_FILES} <= names
    assert "curb = curb.cli:main" in scripts


def test_wheel_holds_no_benchmark_or_test_helpers(wheel):
    """The benchmark and the test helpers are tools for working on Curb (under tests/), not
    part of what an operator installs."""
    with zipfile.ZipFile(wheel) as archive:
        modules = {name for name in archive.namelist() if name.endswith(".py")}
    assert all(name.startswith("curb/") for name in modules), sorted(modules)
    assert not {name for name in modules if "bench" in name or "conftest" in name}


def test_installed_console_script_and_module_report_the_version(venv):
    assert curb.__version__ in run(venv / "bin" / "curb", "--version", cwd=venv)
    assert curb.__version__ in run(venv / "bin" / "python", "-m", "curb", "--version", cwd=venv)


def test_installed_package_runs_the_build_of_this_checkout(venv):
    """The wheel is built as this checkout was installed: with the same hot modules
    compiled where a C compiler is (and CURB_PURE_PYTHON is not 1), pure Python otherwise."""
    assert run(venv / "bin" / "curb", "--version", cwd=venv).strip() == f"curb {curb.__version__} ({build()})"


def test_installed_package_carries_the_unit_files(venv):
    where = run(
        venv / "bin" / "python",
        "-c",
        "import curb, pathlib; print(pathlib.Path(curb.__file__).parent / 'units')",
        cwd=venv,
    ).strip()
    units = Path(where)
    assert units.is_relative_to(venv)
    for unit in UNIT_FILES:
        assert (units / unit).read_text() == (SOURCE / "curb" / "units" / unit).read_text()


def test_bin_curb_says_when_its_environment_is_not_this_users_to_write():
    """Run by another user than the one who made it, bin/curb suggested installing
    python3-venv: the real problem is that the environment's directory is not writable.
    (As root, the script runs as nobody, since root may write anywhere.)"""
    with tempfile.TemporaryDirectory() as where:
        os.chmod(where, 0o755)  # reachable by nobody
        venv = Path(where) / "venv"
        venv.mkdir(mode=0o755)  # someone else's environment, not set up yet
        as_other: list[str] = []
        if os.geteuid() == 0:
            as_other = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        else:
            venv.chmod(0o555)
        result = subprocess.run(
            [*as_other, "bash", str(SOURCE / "bin" / "curb"), "--version"],
            env={"PATH": os.environ["PATH"], "HOME": where, "CURB_VENV": str(venv)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        venv.chmod(0o755)
    assert result.returncode == 1, result
    assert f"cannot set up the virtual environment in {venv}: {venv} belongs to" in result.stderr, result.stderr
    assert "set CURB_VENV to a directory you can write" in result.stderr
    assert "python3-venv" not in result.stderr


def test_two_first_uses_of_bin_curb_at_once_both_set_up_and_run(tmp_path):
    """A test and a service (or two terminals) that both start bin/curb on a fresh
    checkout raced to create the environment, and one failed with "No module named pip":
    the set-up takes turns under a lock, and the second finds it done."""
    venv = tmp_path / "venv"
    env = {**os.environ, "CURB_VENV": str(venv)}
    env.pop("CURB_EXTRAS", None)
    both = [
        subprocess.Popen(
            ["bash", str(SOURCE / "bin" / "curb"), "--version"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [command.communicate(timeout=600) for command in both]
    for command, (out, err) in zip(both, outputs, strict=True):
        assert command.returncode == 0, err
        assert curb.__version__ in out
    installs = sum(err.count("curb: installing into") for _, err in outputs)
    assert installs == 1, "the second command waited for the first's set-up instead of redoing it"
