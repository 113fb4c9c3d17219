"""The `effvision` command line: a thin typer front end over the Python API. This module builds
the root command from the group modules and owns the one error policy: a user error is one line
on stderr and exit 1, a usage error exit 2, --debug shows the traceback."""

from __future__ import annotations

import os
import sys
import traceback

import typer

from ..errors import EffvisionError
from . import data, deploy, pipeline, study, zoo
from .common import ARGV

app = typer.Typer(
    help="Efficient visual recognition end to end: fine-tune, compress, export and benchmark compact models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(zoo.app, name="zoo")
app.add_typer(data.app, name="data")
app.add_typer(study.app, name="study")
for command in pipeline.COMMANDS + deploy.COMMANDS:
    app.command()(command)


@app.callback()
def _root(
    debug: bool = typer.Option(
        False, "--debug", help="Show full tracebacks on errors (accepted after any command too)."
    ),
):
    """Every command accepts --debug; errors otherwise print one line and exit 1."""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ARGV[:] = argv
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach a hub at run time
    try:
        # typer handles usage errors (exit 2) and --help itself and ends with SystemExit
        app(args=argv, prog_name="effvision")
        return 0
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except KeyboardInterrupt:
        print(
            "effvision: interrupted; completed stages are kept, run the same command again to resume", file=sys.stderr
        )
        return 130
    except EffvisionError as exc:
        if debug:
            traceback.print_exc()
        print(f"effvision: error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001  (an unexpected failure still gets one line unless --debug)
        if debug:
            raise
        first = (str(exc).splitlines() or [""])[0]
        print(
            f"effvision: internal error: {type(exc).__name__}: {first} (run again with --debug for the traceback)",
            file=sys.stderr,
        )
        return 1


def entry() -> None:
    sys.exit(main())
