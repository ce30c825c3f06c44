"""Compiles Curb's sans-I/O hot modules with mypyc, or leaves the package pure Python.

Everything else about the package is declared in pyproject.toml; this file only adds the
extension modules. Per-message CPU is spent in many small Python calls (parsing a frame,
the session's rules, the queue's steps, the log's record encoding), and mypyc turns the
calls between compiled modules into C calls. The build never fails because of them: with
CURB_PURE_PYTHON=1, without mypyc, or when the C compiler is missing or fails, the
install goes on with the pure-Python modules, which behave the same.

A module stays pure when mypyc cannot compile it or when Python code must be able to
change it: a class that another module or a test subclasses, a function a test replaces.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# The per-message path, as profiles of the pipelined SEND and consume workloads show it.
COMPILED = [
    "curb/access.py",
    "curb/commands.py",
    "curb/conn.py",
    "curb/deadlines.py",
    "curb/destinations.py",
    "curb/fairqueue.py",
    "curb/frame.py",
    "curb/handout.py",
    "curb/heartbeat.py",
    "curb/intake.py",
    "curb/loop_pass.py",
    "curb/message_limits.py",
    "curb/output.py",
    "curb/payload.py",
    "curb/queue.py",
    "curb/receipts.py",
    "curb/render.py",
    "curb/session.py",
    "curb/timing.py",
    "curb/transaction_rules.py",
    "curb/transactions.py",
    "curb/log/admission.py",
    "curb/log/appends.py",
    "curb/log/core.py",
    "curb/log/cursor.py",
    "curb/log/dying.py",
    "curb/log/idset.py",
    "curb/log/kept.py",
    "curb/log/marks.py",
    "curb/log/parked.py",
    "curb/log/placement.py",
    "curb/log/reader.py",
    "curb/log/record.py",
    "curb/log/ring.py",
    "curb/log/sizes.py",
    "curb/log/syncing.py",
    "curb/log/waiters.py",
    "curb/router/credit.py",
    "curb/router/deliveries.py",
    "curb/router/links.py",
    "curb/router/placement.py",
    "curb/router/routes.py",
    "curb/router/tally.py",
    "curb/router/waits.py",
]
# Steps written in C where a compiled Python call per step still cost thousands of
# instructions: a frame head split into its command and headers; the record format's
# header line, written, parsed and CRC-checked.
C_MODULES = {"curb.frame_c": "curb/frame_c.c", "curb.log.record_c": "curb/log/record_c.c"}


def say(message: str) -> None:
    print(f"curb: {message}", file=sys.stderr)


def extensions() -> list[Any]:
    """The compiled modules' extensions, or none (pure Python) when they cannot be made."""
    if os.environ.get("CURB_PURE_PYTHON") == "1":
        say("CURB_PURE_PYTHON=1: installing the pure-Python modules")
        return []
    try:
        from mypyc.build import mypycify

        # The build environment holds mypy but not Curb's dependencies: the modules mypy
        # follows from the compiled ones are analysed, and their errors left to bin/check.
        compiled = mypycify(["--follow-imports=silent", "--ignore-missing-imports", *COMPILED])
        return [*compiled, *(Extension(name, [source]) for name, source in C_MODULES.items())]
    except (Exception, SystemExit) as err:  # mypyc reports its errors by exiting
        say(f"mypyc could not compile the hot modules ({err!r}): installing the pure-Python modules")
        return []


class OptionalBuildExt(build_ext):
    """build_ext that falls back to pure Python when compiling fails (no C compiler, or
    one that fails): nothing half-built is installed, since the compiled modules are
    copied into place only after every one of them was built."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as err:
            say(f"compiling the hot modules failed ({err!r}): installing the pure-Python modules")
            for ext in self.extensions:  # a wheel packs what was built: none of them, or all
                built = self.get_ext_fullpath(ext.name)
                if os.path.exists(built):
                    os.remove(built)
            self.extensions = []

    def get_outputs(self) -> list[str]:
        return super().get_outputs() if self.extensions else []


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
