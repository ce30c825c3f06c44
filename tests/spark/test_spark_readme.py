"""The Spark page (docs/spark.md) installs Curb from where it is (a checkout or a wheel built
from one), never from the package index, where `curb` is an unrelated package."""

from __future__ import annotations

import re
from pathlib import Path

import curb

SPARK_PAGE = Path(__file__).resolve().parents[2] / "docs" / "spark.md"


def spark_page() -> str:
    return SPARK_PAGE.read_text()


def test_spark_install_lines_name_a_checkout_or_a_wheel():
    commands = [line for line in spark_page().splitlines() if line.startswith("    ")]  # indented blocks
    lines = [line.strip() for line in commands if "pip install" in line]
    assert lines, "the Spark page shows how to install Curb"
    for line in lines:
        for target in re.findall(r"pip install (\S+)", line):
            assert target.startswith(("'.", "'/", "'dist/")), f"not a checkout or a wheel: {line}"
    wheels = re.findall(r"dist/(curb-[^'\[]+\.whl)", spark_page())
    assert wheels == [f"curb-{curb.__version__}-py3-none-any.whl"]


def test_the_spark_page_names_what_executors_need_and_the_error_without_it():
    page = spark_page()
    assert "PYSPARK_PYTHON" in page
    assert "ModuleNotFoundError: No module named 'curb'" in page  # as test_spark_workers.py sees it
