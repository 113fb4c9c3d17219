"""Stop signals as exceptions: SIGTERM and SIGINT (and a time budget's SIGALRM) raise Interrupted
in the main thread, so that long work ends in order — the last checkpoint kept, one line saying
what was kept — and a write in progress can hold the stop back until it is complete."""

from __future__ import annotations

import contextlib
import signal


class Interrupted(BaseException):
    """Raised in the main thread by a stop signal or the deadline. A BaseException, so that an
    `except Exception` that records other errors lets this one end the run. exit_code: 128 + the
    signal's number (130 for SIGINT, 143 for SIGTERM), 0 at a time budget's end."""

    def __init__(self, reason: str, exit_code: int):
        super().__init__(reason)
        self.reason, self.exit_code = reason, exit_code


# deferred_signals() state: a stop that arrived while held; whether one was raised already (a
# second signal, e.g. a scheduler's repeated SIGTERM, must not cut short the orderly end of the first)
_held = {"depth": 0, "pending": None, "raised": False}


def _stop(signum, _frame):
    if _held["raised"]:
        return
    if signum == signal.SIGALRM:
        why = Interrupted("stopped at the time budget", 0)
    else:
        why = Interrupted(f"interrupted by {signal.Signals(signum).name}", 128 + signum)
    if _held["depth"]:
        _held["pending"] = _held["pending"] or why
        return
    _held["raised"] = True
    raise why


@contextlib.contextmanager
def interruptible(deadline_s: float | None = None):
    """SIGTERM, SIGINT and (when deadline_s is given) SIGALRM after deadline_s raise Interrupted.
    The previous handlers come back on exit."""
    timed = deadline_s is not None
    wanted = [signal.SIGTERM, signal.SIGINT] + ([signal.SIGALRM] if timed else [])
    old = {s: signal.signal(s, _stop) for s in wanted}
    _held["raised"] = False
    if timed:
        signal.setitimer(signal.ITIMER_REAL, max(deadline_s, 1e-3))  # 0 would mean no alarm at all
    try:
        yield
    finally:
        if timed:
            signal.setitimer(signal.ITIMER_REAL, 0)
        for s, handler in old.items():
            signal.signal(s, handler)


@contextlib.contextmanager
def deferred_signals():
    """Hold a stop back while a file is written (a table, a checkpoint): one arriving then is
    raised right after, so the write completes and no half-written temporary file is left."""
    _held["depth"] += 1
    try:
        yield
    finally:
        _held["depth"] -= 1
        if not _held["depth"] and _held["pending"]:
            why, _held["pending"] = _held["pending"], None
            _held["raised"] = True
            raise why
