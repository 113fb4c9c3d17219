"""Multi-process training on PyTorch's own engine: torchrun starts the processes, they join one
process group (gloo on CPU, nccl on GPU), and the training loop wraps the model in
DistributedDataParallel. Rank 0 alone logs and writes the run folder.

`effvision train --nproc N` relaunches itself under `torch.distributed.run --standalone` on this
machine; a multi-node job is started by torchrun directly (docs/guides/images.md), and effvision then only joins.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys

import torch
import torch.distributed as dist

from ..errors import EffvisionError
from ..interrupts import Interrupted


def launched_by_torchrun() -> bool:
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def world() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def max_processes(device: str = "auto") -> tuple[int, str]:
    """How many training processes this machine can run, and what bounds it."""
    if device != "cpu" and torch.cuda.is_available():
        n = torch.cuda.device_count()
        return n, f"{n} GPU{'s' if n > 1 else ''}"
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return n, f"{n} CPU core{'s' if n > 1 else ''}, no GPU"


def check_nproc(nproc: int, device: str = "auto") -> None:
    if nproc < 1:
        raise EffvisionError(f"--nproc {nproc}: the number of training processes must be at least 1")
    most, why = max_processes(device)
    if nproc > most:
        raise EffvisionError(
            f"--nproc {nproc}: this machine runs at most {most} training process{'es' if most > 1 else ''} ({why})"
        )


def launch(nproc: int, cli_args: list[str]) -> int:
    """Run `effvision <cli_args>` in nproc processes under torchrun on this machine; its exit code.
    A stop signal is passed on to torchrun (which passes it to the processes: rank 0 writes its
    checkpoint and says what was kept), then this process exits quietly with the signal's code."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "effvision.cli",
        *cli_args,
    ]
    env = {
        **os.environ,
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(max(1, max_processes("cpu")[0] // nproc))),
    }
    proc = subprocess.Popen(cmd, env=env)
    try:
        return proc.wait()
    except Interrupted as stop:
        proc.send_signal(stop.exit_code - 128)
        proc.wait()
        return stop.exit_code


def init() -> None:
    """Join the process group torchrun set up (no-op outside torchrun or when already joined)."""
    if not launched_by_torchrun() or dist.is_initialized():
        return
    _end_with_launcher()
    gpu = torch.cuda.is_available()
    if gpu:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    else:
        torch.set_num_threads(
            max(1, max_processes("cpu")[0] // int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"])))
        )
    dist.init_process_group("nccl" if gpu else "gloo")


def _end_with_launcher() -> None:
    """torchrun starts each process in a session of its own, so a job killed as a process group
    (a scheduler's or a user's kill of `effvision train --nproc N`) would leave its processes
    training on, rank 0 holding the run folder. On Linux the kernel kills them when torchrun
    does; the run then resumes from its last epoch checkpoint. (SIGKILL, not SIGTERM: a rank
    ending in order could wait on a collective the others never join.)"""
    if not sys.platform.startswith("linux"):
        return
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() == 1:  # torchrun died before the call above: nobody is left to wait for
        os._exit(128 + signal.SIGKILL)


def broadcast_flag(flag: bool) -> bool:
    """Rank 0's decision, on every rank (so all ranks stop together)."""
    if world() == 1:
        return flag
    t = torch.tensor([int(flag)], device="cuda" if dist.get_backend() == "nccl" else "cpu")
    dist.broadcast(t, 0)
    return bool(t.item())


def max_param_difference(model: torch.nn.Module) -> float:
    """Largest absolute difference of any parameter between this rank and rank 0 (buffers such
    as BatchNorm statistics are rank 0's by construction: DDP broadcasts them every step)."""
    if world() == 1:
        return 0.0
    flat = torch.cat([p.detach().float().flatten() for p in model.parameters()])
    ref = flat.clone()
    dist.broadcast(ref, 0)
    diff = (flat - ref).abs().max()
    dist.all_reduce(diff, op=dist.ReduceOp.MAX)
    return float(diff)


def gather_objects(obj) -> list:
    """obj of every rank, in rank order, on every rank (one process: [obj])."""
    if world() == 1:
        return [obj]
    out = [None] * world()
    dist.all_gather_object(out, obj)
    return out
