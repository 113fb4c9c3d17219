"""One style for the tree: ruff, pinned once in pyproject.toml, run by `make lint` before the tests
and by the pre-commit hooks at the same version."""

from __future__ import annotations

import re
from pathlib import Path

from effvision import yamlio

ROOT = Path(__file__).resolve().parents[1]


def _pyproject_ruff_pin() -> str:
    pins = re.findall(r'"ruff==([0-9.]+)"', (ROOT / "pyproject.toml").read_text())
    assert len(pins) == 1, pins
    return pins[0]


def test_pre_commit_runs_the_pinned_ruff():
    config = yamlio.load((ROOT / ".pre-commit-config.yaml").read_text())
    hooks = [h for repo in config["repos"] for h in repo["hooks"]]
    assert {h["id"] for h in hooks} == {"ruff-format", "ruff-check"}
    for hook in hooks:
        assert hook["additional_dependencies"] == [f"ruff=={_pyproject_ruff_pin()}"], hook["id"]


def test_make_test_lints_first():
    makefile = (ROOT / "Makefile").read_text()
    prerequisites = re.search(r"^test:(.*)$", makefile, re.M).group(1).split()
    assert "lint" in prerequisites
    lint_recipe = re.search(r"^lint:.*\n((?:\t.*\n)+)", makefile, re.M).group(1)
    assert "ruff format --check" in lint_recipe and "ruff check" in lint_recipe
