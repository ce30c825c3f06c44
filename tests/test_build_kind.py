"""How the build in use is told: `curb --version` names the modules mypyc compiled and,
apart, those written in C; bin/_env installs again when a compiled module's source,
Python or C, is newer than the module it built."""

from __future__ import annotations

import os
import subprocess
import sysconfig
from pathlib import Path

import pytest

from curb import compiled

SOURCE = Path(__file__).resolve().parent.parent


def test_version_names_the_c_modules_apart_from_the_mypyc_ones(monkeypatch):
    # curb/frame.py is a Python source (mypyc's); curb/frame_c has only its C source.
    monkeypatch.setattr(compiled, "compiled_modules", lambda: ["curb.frame", "curb.frame_c", "curb.log.record_c"])
    assert compiled.build() == "compiled with mypyc: curb.frame; in C: curb.frame_c, curb.log.record_c"
    monkeypatch.setattr(compiled, "compiled_modules", lambda: ["curb.frame"])
    assert compiled.build() == "compiled with mypyc: curb.frame"
    monkeypatch.setattr(compiled, "compiled_modules", list)
    assert compiled.build() == "pure Python"


def stale_check() -> str:
    """bin/_env's _curb_compiled_stale, as its text stands."""
    text = (SOURCE / "bin" / "_env").read_text()
    start = text.index("_curb_compiled_stale() {")
    return text[start : text.index("\n}\n", start) + 3]


@pytest.mark.parametrize(
    "newest, stale",
    [("module", False), ("frame_c.c", True), ("frame.py", True), ("setup.py", True)],
)
def test_an_edited_python_or_c_source_makes_the_install_due(tmp_path, newest, stale):
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    top, venv = tmp_path / "top", tmp_path / "venv"
    (top / "curb").mkdir(parents=True)
    venv.mkdir()
    files = {
        "setup.py": top / "setup.py",
        "frame.py": top / "curb" / "frame.py",
        "frame_c.c": top / "curb" / "frame_c.c",
        "build": venv / ".curb-build",
    }
    modules = [top / "curb" / f"frame{suffix}", top / "curb" / f"frame_c{suffix}"]
    for path in [*files.values(), *modules]:
        path.write_text("")
        os.utime(path, (1_000_000, 1_000_000))
    for path in modules if newest == "module" else [files[newest]]:
        os.utime(path, (2_000_000, 2_000_000))
    if newest != "setup.py":
        os.utime(files["build"], (3_000_000, 3_000_000))  # the install came after setup.py
    script = f"top={top}\nvenv={venv}\n{stale_check()}_curb_compiled_stale && echo stale || echo fresh"
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == ("stale" if stale else "fresh")
