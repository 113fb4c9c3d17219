"""YAML as effvision reads and writes it: safe (no Python tags run), and numbers like 1e-4 are
floats, as YAML 1.2 and the people who type them mean (YAML 1.1, PyYAML's default, wants a dot
and a signed exponent, so `lr: 1e-4` would be the string "1e-4" wherever no type converts it)."""

from __future__ import annotations

import re
from typing import Any

import yaml

YAMLError = yaml.YAMLError  # every failure of load(); callers need not import PyYAML for it
_EXPONENT_FLOAT = re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")


class Loader(yaml.SafeLoader):
    pass


class Dumper(yaml.SafeDumper):
    """Quotes the strings Loader would read as floats, so what is dumped loads back the same."""


for _cls in (Loader, Dumper):
    _cls.add_implicit_resolver("tag:yaml.org,2002:float", _EXPONENT_FLOAT, list("-+0123456789"))


def load(text: str) -> Any:
    """Parse YAML text; every failure is a YAMLError. PyYAML's constructors raise other
    errors on bad values: ValueError (a date 2020-13-01, "!!int x"), IndexError ("!!int "),
    AttributeError ("!!timestamp 5"), RecursionError ("[[[...")."""
    try:
        return yaml.load(text, Loader=Loader)
    except YAMLError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise YAMLError(f"{type(exc).__name__}: {str(exc)[:200]}") from None


def dump(data: Any, **options) -> str:
    return yaml.dump(data, Dumper=Dumper, **options)
