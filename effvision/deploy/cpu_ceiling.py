"""The CPU's theoretical peak (operations per second) for a precision, from its instruction set,
its CPUs and its clock: the ceiling a model's achieved FLOP/s is divided by.

A measured matrix product is not a ceiling (ONNX Runtime's convolutions beat one on an AVX-512
EPYC: 229 against 203 GFLOP/s), so the ceiling is computed: every CPU the process may run on
counted as a whole core issuing two of its widest multiply-add instructions per cycle (no x86
core issues more), at the highest clock it may run at: the boost clock where cpufreq tells it,
else twice the nominal one (a virtual machine hides the boost; see BOOST_BOUND).
Where the instruction set or the clock cannot be read (not x86, no /proc/cpuinfo) there is no
theoretical ceiling and the caller falls back to a measured probe (roofline.py)."""

from __future__ import annotations

import glob
import os
import re

from ..env import cpu_flags, cpu_name

# Multiply-adds per cycle per core for a precision, by the widest instruction that does them
# (flag, MACs per instruction, name), best first. Two instructions issue per cycle.
_ISSUE_PER_CYCLE = 2
_MAC_INSTRUCTIONS = {
    "fp32": [
        ("avx512f", 16, "AVX-512 FMA"),
        ("fma", 8, "AVX2 FMA"),
        ("avx", 8, "AVX"),  # a separate multiply and add: counted as a multiply-add, an upper bound
        ("sse2", 4, "SSE2"),
    ],
    "bf16": [("amx_bf16", 512, "AMX-BF16 (a tile product per cycle)"), ("avx512_bf16", 32, "AVX-512 BF16")],
    "fp16": [("amx_fp16", 512, "AMX-FP16 (a tile product per cycle)"), ("avx512_fp16", 32, "AVX512-FP16")],
    "int8": [
        ("amx_int8", 1024, "AMX-INT8 (a tile product per cycle)"),
        ("avx512_vnni", 64, "AVX-512 VNNI"),
        ("avx512bw", 64, "AVX-512 BW"),
        ("avx_vnni", 32, "AVX-VNNI"),
        ("avx2", 32, "AVX2"),
    ],
}
# AMX units issue one tile product per cycle, not two: their entries above are per cycle already.
_ONE_ISSUE = {"amx_bf16", "amx_fp16", "amx_int8"}


def cpu_count() -> int:
    """The CPUs this process may run on (a runtime's threads cannot use more)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


# Where only the nominal clock can be read (a virtual machine reports its host's), the boost clock
# is bounded by twice it: server CPUs boost to 1.5-1.95x their base (EPYC 9654 2.4 -> 3.7 GHz, Xeon
# 8480+ 2.0 -> 3.8, Xeon 6980P 2.0 -> 3.9). One core of a 2.1 GHz Xeon VM ran ONNX Runtime's matrix
# product at 160 GFLOP/s, 2.5 GHz x 64 FLOP/cycle at the least: the nominal clock is no ceiling.
BOOST_BOUND = 2.0


def clock_hz() -> tuple[float, str] | None:
    """The highest clock the CPU may run at, and where it was read: the boost clock from cpufreq's
    cpuinfo_max_freq, else BOOST_BOUND times the nominal one (the model name's "@ x GHz",
    /proc/cpuinfo's "cpu MHz", which a virtual machine reports for its host)."""
    boost = []
    for path in glob.glob("/sys/devices/system/cpu/cpu[0-9]*/cpufreq/cpuinfo_max_freq"):
        try:
            with open(path) as f:
                boost.append(int(f.read().strip()) * 1e3)
        except (OSError, ValueError):
            continue
    if boost:
        return max(boost), "boost clock, cpufreq cpuinfo_max_freq"
    nominal = []
    if m := re.search(r"@\s*([\d.]+)\s*GHz", cpu_name()):
        nominal.append(float(m.group(1)) * 1e9)
    try:
        with open("/proc/cpuinfo") as f:
            nominal += [float(line.split(":", 1)[1]) * 1e6 for line in f if line.startswith("cpu MHz")]
    except (OSError, ValueError):
        pass
    if nominal:
        hz = max(nominal)
        return (
            BOOST_BOUND * hz,
            f"{BOOST_BOUND:g} x the nominal {hz / 1e9:.2f} GHz of /proc/cpuinfo: no boost clock readable",
        )
    return None


def ceiling(
    precision: str, flags: set[str] | None = None, cpus: int | None = None, clock: tuple[float, str] | None = None
) -> dict | None:
    """Operations per second (2 per multiply-add) this CPU cannot exceed in `precision`, with how
    it was computed; None where the instruction set or the clock is unknown. A precision without
    instructions of its own runs at most at the fp32 rate (its work converted to fp32)."""
    flags = cpu_flags() if flags is None else flags
    clock = clock_hz() if clock is None else clock
    cpus = cpus or cpu_count()
    if clock is None:
        return None
    found = None
    for p in dict.fromkeys((precision, "fp32")):
        for flag, macs, name in _MAC_INSTRUCTIONS.get(p, []):
            if flag in flags:
                per_cycle = 2 * macs * (1 if flag in _ONE_ISSUE else _ISSUE_PER_CYCLE)
                if found is None or per_cycle > found[0]:
                    found = (per_cycle, name)
                break
    if found is None:
        return None
    per_cycle, name = found
    hz, where = clock
    return {
        "precision": precision,
        "flops_per_s": cpus * per_cycle * hz,
        "probe": "theoretical",
        "how": f"{cpus} CPUs x {per_cycle} ops/cycle ({name}) x {hz / 1e9:.2f} GHz ({where})",
    }
