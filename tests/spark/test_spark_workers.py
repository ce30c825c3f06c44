"""What a user sees when Spark's Python workers cannot import Curb (PYSPARK_PYTHON pointing at
a Python without it), as docs/spark.md describes it: the driver, which has Curb, runs in a Spark
of its own whose workers use a virtual environment with PySpark and pyarrow but not Curb."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

DEADLINE_S = 300


def python_without_curb(place: Path) -> Path:
    """A virtual environment holding this one's packages but Curb (however it was installed)."""
    venv.create(place, with_pip=False)
    target = next((place / "lib").glob("python3*/site-packages"))
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not entry.name.lower().startswith(("curb", "__editable__")):
            (target / entry.name).symlink_to(entry)
    python = place / "bin" / "python"
    assert subprocess.run([python, "-c", "import pyspark, pyarrow"], cwd=place).returncode == 0
    assert subprocess.run([python, "-c", "import curb"], cwd=place, capture_output=True).returncode != 0
    return python


def test_workers_without_curb_fail_at_load_with_no_module_named_curb(tmp_path):
    python = python_without_curb(tmp_path / "env")
    job = (
        "from curb.spark.local import local_spark\n"
        f"spark = local_spark('no-curb-on-workers', 1, workers_python={str(python)!r})\n"
        "spark.readStream.format('curb').option('endpoints', '127.0.0.1:1').load()\n"
    )
    done = subprocess.run([sys.executable, "-c", job], cwd=tmp_path, capture_output=True, text=True, timeout=DEADLINE_S)
    assert done.returncode != 0
    assert "[PYTHON_DATA_SOURCE_ERROR] Failed to create Python data source instance" in done.stderr, done.stderr
    assert "ModuleNotFoundError: No module named 'curb'" in done.stderr, done.stderr
