"""README.md's commands, in the order a reader meets them: every line of its ```bash blocks and
every ```python block; and parse_cli, which checks an effvision command line without running it.
tests/test_readme.py checks README's commands that way (each `make` target exists, each effvision
command line parses, each recipe loads), tests/test_site.py the guides'; `make readme-check` runs
them all, in order, on a fresh clone:

    python tests/readme_commands.py --run      # in the checkout to run them in (stops at the first failure)

(--run needs no package beyond Python's own: it starts before make demo has made .venv.)
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"^```(bash|python)\n(.*?)^```", re.S | re.M)


def readme_commands(text: str) -> list[tuple[str, str]]:
    """[("bash", one command line) or ("python", a whole block)] in order. A bash line's comment
    after `#` is dropped; a line ending in a backslash continues on the next."""
    found = []
    for kind, body in BLOCK.findall(text):
        if kind == "python":
            found.append(("python", body))
            continue
        for line in body.replace("\\\n", " ").splitlines():
            command = re.sub(r"\s+#.*$", "", line).strip()
            if command and not command.startswith("#"):
                found.append(("bash", command))
    return found


def parse_cli(args: list[str]) -> list[str]:
    """Parse an effvision command line as the CLI would (unknown commands and options, missing
    arguments and bad values raise UsageError) without running it; return its recipe arguments."""
    import typer

    from effvision.cli import app

    cmd, name, recipes = typer.main.get_command(app), "effvision", []
    while True:
        ctx = cmd.make_context(name, list(args))
        if not hasattr(cmd, "commands"):
            recipes += [v for k, v in ctx.params.items() if k == "recipe" and v]
            sets = ctx.params.get("set_") or []
            return [(r, list(sets)) for r in recipes]
        rest = [*ctx._protected_args, *ctx.args]
        name, args = rest[0], rest[1:]
        cmd = cmd.get_command(ctx, name)
        assert cmd is not None, f"no command {name}"


def run_all(root: Path) -> int:
    commands = readme_commands((root / "README.md").read_text())
    for i, (kind, text) in enumerate(commands, 1):
        shown = text if kind == "bash" else "python <<README block>>"
        print(f"[{i}/{len(commands)}] {shown}", flush=True)
        start = time.monotonic()
        if kind == "bash":
            done = subprocess.run(["bash", "-eo", "pipefail", "-c", text], cwd=root)
        else:
            done = subprocess.run([str(root / ".venv/bin/python"), "-"], input=text, text=True, cwd=root)
        print(f"[{i}/{len(commands)}] exit {done.returncode} after {time.monotonic() - start:.0f} s", flush=True)
        if done.returncode:
            print(f"README command failed: {shown}", file=sys.stderr)
            return done.returncode
    print(f"all {len(commands)} README commands worked")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] != ["--run"]:
        print(__doc__)
        raise SystemExit(2)
    raise SystemExit(run_all(Path.cwd()))
