"""env.json: what produced a run (versions, CPU/GPU, git SHA), so every figure can be reproduced."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata


def package_version(pkg: str) -> str | None:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_flags() -> set[str]:
    """The CPU's feature flags (/proc/cpuinfo), empty where the file is not there."""
    try:
        with open("/proc/cpuinfo") as f:
            return set(next((line for line in f if line.startswith("flags")), "").split(":", 1)[-1].split())
    except OSError:
        return set()


def cpu_label() -> str:
    """The CPU named as a figure names it: model, cores and its widest vector extension (timings
    of one CPU compare only with that CPU's; int8 speed depends on VNNI)."""
    flags = cpu_flags()
    isa = next(
        (
            name
            for flag, name in (("avx512_vnni", "AVX-512 VNNI"), ("avx512f", "AVX-512"), ("avx2", "AVX2"))
            if flag in flags
        ),
        "",
    )
    return ", ".join(p for p in (cpu_name(), f"{os.cpu_count()} cores", isa) if p)


def git_sha() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=os.path.dirname(os.path.abspath(__file__)),
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def command_line() -> str | None:
    """The effvision command that is running (None when effvision is used as a library)."""
    import shlex

    prog = os.path.basename(sys.argv[0]) if sys.argv else ""
    return "effvision " + shlex.join(sys.argv[1:]) if prog == "effvision" else None


def collect_env() -> dict:
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "effvision": package_version("effvision"),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torchvision": package_version("torchvision"),
        "timm": package_version("timm"),
        "onnx": package_version("onnx"),
        "onnxruntime": package_version("onnxruntime"),
        "torch_pruning": package_version("torch-pruning"),
        "openvino": package_version("openvino"),  # the optional runtimes: None where not installed
        "nncf": package_version("nncf"),
        "litert": package_version("ai-edge-litert"),
        "executorch": package_version("executorch"),
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "gpu": gpu,
        "git_sha": git_sha(),
        "command": command_line(),
    }
