"""The command line's surface is stable: every command and every option (names, flags, defaults,
whether required or repeatable) equals the snapshot in tests/data/cli_surface.json, and
`effvision --help` and each `COMMAND --help` name them. A deliberate change rewrites the
snapshot (`python tests/test_cli_surface.py --write`) and shows up in review as a diff of it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

SNAPSHOT = Path(__file__).parent / "data" / "cli_surface.json"


def surface() -> dict:
    """{"effvision zoo list": {"options": [...]} ...} for every command of the app."""
    from effvision.cli import app

    found: dict = {}

    # typer carries its own copy of click: recognise groups and arguments by what they have.
    def walk(cmd, path: str) -> None:
        params = []
        for p in cmd.params:
            params.append(
                {
                    "name": p.name,
                    "kind": p.param_type_name,
                    "opts": sorted(p.opts + p.secondary_opts),
                    "required": p.required,
                    "multiple": bool(getattr(p, "multiple", False)),
                    "flag": bool(getattr(p, "is_flag", False)),
                    "default": None if callable(p.default) else repr(p.default),
                }
            )
        group = hasattr(cmd, "commands")
        found[path] = {"group": group, "params": params}
        if group:
            for name, sub in cmd.commands.items():
                walk(sub, f"{path} {name}")

    walk(typer.main.get_command(app), "effvision")
    return found


def test_commands_and_options_match_the_snapshot():
    expected = json.loads(SNAPSHOT.read_text())
    now = surface()
    assert sorted(now) == sorted(expected), "commands added or removed"
    for path, spec in expected.items():
        assert now[path] == spec, f"{path}: options changed"


def test_help_lists_every_command_and_option():
    from effvision.cli import main

    expected = json.loads(SNAPSHOT.read_text())
    for path, spec in expected.items():
        words = path.split()[1:]
        help_text = _help(main, words)
        children = sorted(
            p.split()[-1] for p in expected if p.startswith(path + " ") and len(p.split()) == len(words) + 2
        )
        for child in children:
            assert child in help_text, f"`{path} --help` does not list {child}"
        for p in spec["params"]:
            if p["kind"] == "option" and "--help" not in p["opts"]:
                assert any(o in help_text for o in p["opts"]), f"`{path} --help` does not show {p['opts']}"


def _help(main, words: list[str]) -> str:
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main([*words, "--help"])
    assert code == 0
    return buf.getvalue()


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    SNAPSHOT.write_text(json.dumps(surface(), indent=1) + "\n")
    print(f"wrote {SNAPSHOT}")
