"""The `effvision` command line: a thin typer front end over the Python API. This module builds
the root command from the group modules and owns the one error policy: a user error is one line
on stderr and exit 1, a usage error exit 2, --debug shows the traceback."""

from __future__ import annotations

import os
import shlex
import sys
import traceback

import typer

from ..errors import EffvisionError
from ..interrupts import Interrupted, interruptible
from . import data, deploy, pipeline, search, study, zoo
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
app.add_typer(search.app, name="search")
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
        # typer handles usage errors (exit 2) and --help itself and ends with SystemExit;
        # SIGINT and SIGTERM end the command as Interrupted, after its checkpoint is written
        with interruptible():
            app(args=argv, prog_name="effvision")
        return 0
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except (Interrupted, KeyboardInterrupt) as stop:
        return _interrupted(stop, argv)
    except EffvisionError as exc:
        if debug:
            traceback.print_exc()
        print(f"effvision: error: {one_line(str(exc))}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001  (an unexpected failure still gets one line unless --debug)
        from ..fileio import write_failure

        if debug:
            raise
        failure = write_failure(exc, getattr(exc, "filename", None) or "a file") if isinstance(exc, OSError) else None
        if failure is not None:  # a full or failing disk outside our atomic writes
            print(f"effvision: error: {one_line(str(failure))}", file=sys.stderr)
            return 1
        first = one_line((str(exc).splitlines() or [""])[0])
        print(
            f"effvision: internal error: {type(exc).__name__}: {first} (run again with --debug for the traceback)",
            file=sys.stderr,
        )
        return 1


def one_line(text: str) -> str:
    """An error message as one line: control characters a user's input brought in (a newline or
    carriage return in a file name) are shown escaped, as Python writes them."""
    return "".join(c if c.isprintable() or c == "\t" else repr(c)[1:-1] for c in text)


def _interrupted(stop: BaseException, argv: list[str]) -> int:
    """One line (from rank 0 of a multi-process job): what the run folder kept and the command
    that continues; exit 128 + the signal (130 SIGINT, 143 SIGTERM)."""
    # what the pipeline module defines, where it was imported: a stop that came while the command
    # was still importing (torch half-loaded) must not import anything more, or it fails in turn
    run_interrupted = getattr(sys.modules.get("effvision.pipeline"), "RunInterrupted", ())
    code = stop.exit_code if isinstance(stop, Interrupted) else 130
    if os.environ.get("RANK", "0") != "0":
        return code
    if isinstance(stop, run_interrupted):
        line = f"{stop.reason}; continue with: effvision {shlex.join(argv)}"
    else:
        line = stop.reason if isinstance(stop, Interrupted) else "interrupted by SIGINT"
    print(f"effvision: {line}", file=sys.stderr)
    return code


def entry() -> None:
    sys.exit(main())
