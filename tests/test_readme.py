"""README.md is the front door: short, and every command in it works. Here each command is checked
without running it (a make target that exists, an effvision command line that parses, recipes that
load, Python that compiles); `make readme-check` runs them all in order on a fresh clone."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from readme_commands import parse_cli, readme_commands

from effvision.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
COMMANDS = readme_commands(README)


def make_targets() -> set[str]:
    return set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))


def test_readme_is_short_and_starts_with_the_two_commands():
    assert len(README.splitlines()) < 150
    assert COMMANDS[:2] == [("bash", "make demo"), ("bash", "make test")]
    kinds = [k for k, _ in COMMANDS]
    assert "python" in kinds and len(COMMANDS) >= 6


def test_the_extraction_reads_blocks_lines_and_continuations():
    text = "x\n```bash\nmake demo   # note\n# a comment\na \\\n  b\n```\n```python\nprint(1)\n```\n"
    assert readme_commands(text) == [("bash", "make demo"), ("bash", "a    b"), ("python", "print(1)\n")]


@pytest.mark.parametrize("kind,text", COMMANDS, ids=[t.splitlines()[0][:60] for _, t in COMMANDS])
def test_every_readme_command_is_one_that_works(kind, text):
    if kind == "python":
        compile(text, "README.md", "exec")
        import effvision

        for name in re.findall(r"effvision\.(\w+)\(", text):
            assert hasattr(effvision, name), f"README calls effvision.{name}, which does not exist"
        for path in re.findall(r'"(compress/[\w.-]+\.yaml)"', text):
            load_recipe(ROOT / path)
        return
    words = shlex.split(text)
    if words[0] == "make":
        assert set(words[1:]) <= make_targets(), f"no make target in {words[1:]}"
    elif words[0] == ".venv/bin/effvision":
        for recipe, sets in parse_cli(words[1:]):
            load_recipe(ROOT / recipe, sets)
    elif words[0] == "python":
        assert (ROOT / words[1]).is_file()
    else:
        pytest.fail(f"README command of an unknown kind (teach this test how to check it): {text}")


def test_a_broken_command_is_caught():
    # typer carries its own copy of click: match the usage errors by their messages
    with pytest.raises(Exception, match="No such option"):
        parse_cli(["compress", "compress/default.yaml", "--run-folder", "x"])
    with pytest.raises(Exception, match="no command compres"):
        parse_cli(["compres", "compress/default.yaml"])
    with pytest.raises(Exception, match="Missing parameter: artifact"):
        parse_cli(["predict"])
