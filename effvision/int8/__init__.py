"""int8 for any runtime: one maker (maker.make_int8), one ship-or-fp32 decision (maker.ship_or_fp32),
the ONNX node search they use where a runtime keeps named nodes in float (node_search.py), and how
files are timed against each other (timing.py). Imports point down only: compression -> int8 ->
deploy (the benchmark harness) -> runtimes."""

from .maker import Floor, Int8Result, Int8Settings, make_int8, ship_or_fp32
from .timing import SpeedCheck, Timing, faster_than_fp32

__all__ = [
    "Floor",
    "Int8Result",
    "Int8Settings",
    "SpeedCheck",
    "Timing",
    "faster_than_fp32",
    "make_int8",
    "ship_or_fp32",
]
