"""One Registry class for everything looked up by name (models, datasets, stages, backends)."""

from __future__ import annotations

import difflib
from typing import Any, Callable, Iterator

from .errors import EffvisionError


class UnknownNameError(EffvisionError, ValueError):
    """An unknown registry name; a ValueError (as callers expect) and a one-line user error."""


def suggest(name: str, choices: list[str], what: str) -> str:
    """The message for an unknown name: close matches first, then the full list when short."""
    close = difflib.get_close_matches(name, choices, n=3, cutoff=0.5)
    msg = f"unknown {what} '{name}'"
    if close:
        msg += f"; did you mean {', '.join(repr(c) for c in close)}?"
    if len(choices) <= 12:
        msg += f" (choices: {', '.join(sorted(choices))})"
    return msg


class Registry:
    """A named table of entries; register with a decorator, look up with get()."""

    def __init__(self, what: str):
        self.what = what
        self._entries: dict[str, Any] = {}

    def register(self, name: str, obj: Any = None) -> Callable:
        """Register obj under name (decorator form when obj is None); duplicates raise."""

        def add(o: Any) -> Any:
            if name in self._entries:
                raise KeyError(f"{self.what} '{name}' is already registered")
            self._entries[name] = o
            return o

        return add if obj is None else add(obj)

    def get(self, name: str) -> Any:
        if name not in self._entries:
            raise UnknownNameError(suggest(name, list(self._entries), self.what))
        return self._entries[name]

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)


MODELS = Registry("model")
DATASETS = Registry("dataset")
SAMPLERS = Registry("sampler")
SELECTORS = Registry("selector")
STAGES = Registry("stage type")
BACKENDS = Registry("backend")
RUNTIMES = Registry("runtime")
