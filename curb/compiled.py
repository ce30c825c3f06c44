"""Which of Curb's modules run compiled (mypyc), for `curb --version`.

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
    """The build in use, as `curb --version` says it."""
    names = compiled_modules()
    return f"compiled with mypyc: {', '.join(names)}" if names else "pure Python"
