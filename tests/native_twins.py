"""The pure-Python twin of a module that hands steps to C: the same source loaded as a
module of its own with its C steps switched off, to compare the two builds in one
process. Used where the C modules are built (the compiled build)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SOURCE = Path(__file__).resolve().parent.parent / "curb"


def pure_twin(relative: str) -> ModuleType:
    """curb/<relative> loaded from its .py source, with NATIVE off."""
    name = "pure_twin_" + relative.replace("/", "_").removesuffix(".py")
    spec = importlib.util.spec_from_file_location(name, SOURCE / relative)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while it runs
    spec.loader.exec_module(module)
    setattr(module, "NATIVE", False)  # noqa: B010 (a ModuleType has no such attribute to type)
    return module
