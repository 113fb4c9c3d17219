"""Silencing what native libraries print on the process's own stderr (file descriptor 2), which
Python's sys.stderr cannot redirect: decord's C++ logger, LiteRT's "Created TensorFlow Lite XNNPACK
delegate" line. The reason for any failure still reaches the user, as the exception we raise."""

from __future__ import annotations

import os
import sys
import threading
from contextlib import contextmanager

_LOCK = threading.Lock()  # one redirection at a time: fd 2 is the whole process's


@contextmanager
def native_stderr_silenced():
    """Point file descriptor 2 at /dev/null for the block, then back."""
    with _LOCK:
        sys.stderr.flush()
        saved = os.dup(2)
        try:
            with open(os.devnull, "wb") as null:
                os.dup2(null.fileno(), 2)
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
