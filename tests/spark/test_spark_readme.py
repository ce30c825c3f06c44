"""The README's Spark section installs Curb from where it is (a checkout or a wheel built from
one), never from the package index, where `curb` is an unrelated package."""

from __future__ import annotations

import re
from pathlib import Path

import curb

README = Path(__file__).resolve().parents[2] / "README.md"


def spark_section() -> str:
    text = README.read_text()
    return text[text.index("\n## Spark\n") :].split("\n## ", 2)[1]


def test_spark_install_lines_name_a_checkout_or_a_wheel():
    commands = [line for line in spark_section().splitlines() if line.startswith("    ")]  # indented blocks
    lines = [line.strip() for line in commands if "pip install" in line]
    assert lines, "the Spark section shows how to install Curb"
    for line in lines:
        for target in re.findall(r"pip install (\S+)", line):
            assert target.startswith(("'.", "'/", "'dist/")), f"not a checkout or a wheel: {line}"
    wheels = re.findall(r"dist/(curb-[^'\[]+\.whl)", spark_section())
    assert wheels == [f"curb-{curb.__version__}-py3-none-any.whl"]


def test_the_spark_section_names_what_executors_need_and_the_error_without_it():
    section = spark_section()
    assert "PYSPARK_PYTHON" in section
    assert "ModuleNotFoundError: No module named 'curb'" in section  # as test_spark_workers.py sees it
