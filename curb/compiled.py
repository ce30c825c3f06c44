"""Which of Curb's modules run compiled (mypyc, or written in C), for `curb --version`.

setup.py compiles the hot modules when it can and installs the pure-Python ones when it
cannot, so the same version may run either build. The answer is read from what Python
imports, not from a record of the install: a module is compiled when the file it loads
from is an extension module.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def compiled_modules() -> list[str]:
    """The names of the modules under curb/ that load from an extension module, sorted."""
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    names = []
    for path in _PACKAGE.rglob("*.so"):
        suffix = next((s for s in suffixes if path.name.endswith(s)), None)
        if suffix is None:
            continue
        parts = path.relative_to(_PACKAGE.parent).with_name(path.name[: -len(suffix)]).parts
        name = ".".join(parts)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin is not None and Path(spec.origin).resolve() == path.resolve():
            names.append(name)
    return sorted(names)


def build() -> str:
    """The build in use, as `curb --version` says it: the modules mypyc compiled from
    their Python, then those written in C (no .py beside them)."""
    names = compiled_modules()
    if not names:
        return "pure Python"
    in_c = [name for name in names if not _PACKAGE.parent.joinpath(*name.split(".")).with_suffix(".py").exists()]
    mypyc = [name for name in names if name not in in_c]
    return f"compiled with mypyc: {', '.join(mypyc)}" + (f"; in C: {', '.join(in_c)}" if in_c else "")
