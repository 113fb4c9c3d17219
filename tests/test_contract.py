"""The house rules hold on the package, and each one fails when broken (in a copy of the package)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from contract import breaches

PACKAGE = Path(__file__).resolve().parent.parent / "effvision"


def test_the_package_keeps_the_house_rules():
    assert breaches(PACKAGE) == []


@pytest.fixture
def copy(tmp_path) -> Path:
    shutil.copytree(PACKAGE, tmp_path / "effvision", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path / "effvision"


def _add(path: Path, line: str) -> None:
    path.write_text(path.read_text() + "\n\n" + line + "\n")


def test_an_import_inside_a_function_that_closes_a_circle_is_found(copy):
    # runtimes is imported by deploy; a function of runtimes importing deploy back closes a circle
    _add(copy / "runtimes" / "base.py", "def _late():\n    from ..deploy import bench  # noqa: F401")
    found = breaches(copy)
    assert any(b.startswith("import cycle:") and "effvision.runtimes.base" in b for b in found), found
    assert any("runtimes/base.py" in b and "a layer above it" in b for b in found), found


def test_a_cycle_within_one_layer_is_found(copy):
    _add(copy / "int8" / "timing.py", "from . import maker  # noqa: E402,F401")
    found = breaches(copy)
    assert any("effvision.int8.maker" in b and "effvision.int8.timing" in b for b in found if "cycle" in b), found


def test_private_names_long_functions_and_long_files_are_found(copy):
    _add(copy / "goals.py", "from .data import Transformed  # noqa\nfrom .env import _hidden  # noqa")
    body = "\n".join(f"    x{i} = {i}" for i in range(85))
    _add(copy / "errors.py", f"def too_long():\n{body}\n")
    (copy / "yamlio.py").write_text((copy / "yamlio.py").read_text() + "\n" * 520)
    found = "\n".join(breaches(copy))
    assert "imports the private name _hidden of effvision.env" in found
    assert "goals.py" in found and "a layer above it" in found  # goals is a base module: data is above it
    assert "too_long is 86 lines, over 80" in found
    assert "effvision/yamlio.py: " in found and "lines, over 500" in found


def test_make_lint_runs_the_contract_and_it_exits_non_zero_on_a_breach(copy):
    makefile = (PACKAGE.parent / "Makefile").read_text()
    assert "tests/contract.py effvision" in makefile.split("\nlint:")[1].split("\n\n")[0]
    _add(copy / "runtimes" / "base.py", "def _late():\n    from ..compression import plan  # noqa: F401")
    script = Path(__file__).with_name("contract.py")
    done = subprocess.run([sys.executable, str(script), str(copy)], capture_output=True, text=True)
    assert done.returncode == 1 and "a layer above it" in done.stdout, done.stdout + done.stderr
    clean = subprocess.run([sys.executable, str(script), str(PACKAGE)], capture_output=True, text=True)
    assert clean.returncode == 0, clean.stdout


def test_a_module_in_no_layer_is_said(copy):
    (copy / "newroom.py").write_text('"""A module nobody placed."""\n')
    assert breaches(copy) == ["effvision.newroom is in no layer of tests/contract.py: add it to LAYERS"]
