"""The GPU plan: the two commands a lent GPU machine runs (`bench`, the deployment suite; `speed`,
the speed recipe's h200 preset to 94%), what each needs and carries, and the preflight that
checks it in well under a second before any GPU time is spent. BENCHMARKS.md's GPU section
gives the calls; `make gpu-bench` / `make gpu-speedrun` run the same commands.

That machine runs its own python3 (3.12, torch 2.11) with no package registry: what it lacks
travels as cp312 wheels in .whl/ (`make gpu-wheels`), installed here into GPU_SITE first.

    python3 -m effvision.gpu_plan preflight bench|speed [--device cpu]
    python3 -m effvision.gpu_plan bench [--out DIR] [--budget S] [-- suite options]
    python3 -m effvision.gpu_plan speed [--out DIR] [--budget S] [--seeds N] [--set KEY=VALUE ...]
    python3 -m effvision.gpu_plan wheels          # the pinned wheels, for `make gpu-wheels`
    python3 -m effvision.gpu_plan pack-data SRC DEST   # CIFAR-10 zips -> .xz, to fit the transfer
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from .errors import one_line  # effvision/errors.py imports nothing: the preflight stays light

REPO = Path(__file__).resolve().parents[1]
GPU_SITE = "/tmp/effvision-gpu-site"
WHEEL_DIR = REPO / ".whl"
DATA_PACK = REPO / ".data" / "cifar10-xz"  # what travels: the two zips, xz-compressed (62 MB -> about 19)
CIFAR_ZIPS = ("cifar10-jpeg-train.zip", "cifar10-jpeg-test.zip")

# What the GPU machine lacks and the plan needs, pinned as in pyproject.toml. typing-extensions
# travels too: pydantic-core needs >= 4.14.1 and the machine's version is not documented.
WHEELS = {
    "pydantic": "2.14.4",
    "pydantic-core": "2.50.5",
    "annotated-types": "0.8.0",
    "typing-inspection": "0.4.5",
    "typing-extensions": "4.16.0",
    "torch-pruning": "1.6.1",
}

# The distributions that machine's python3 holds (its documentation, as read on 2026-11-17): the
# rehearsal hides every other installed package from the suite it runs here.
GPU_MACHINE = frozenset(
    """absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build
    certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
    cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock
    flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx
    huggingface-hub humanize hypothesis idna imageio interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib
    jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax llvmlite
    lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict
    multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas
    nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile
    nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13
    nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript opencv-python-headless
    optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip
    pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
    pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil
    pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image scikit-learn
    scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six sortedcontainers
    statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm
    tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers
    treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt
    xarray xxhash yarl zipp""".split()
)


@dataclass(frozen=True)
class Command:
    """One call on the device machine: the modules its run imports (checked by the preflight),
    what travels with it (`carry`), its budget and the call's timeout."""

    modules: dict[str, str]  # import name -> distribution
    carry: tuple[str, ...]
    budget_s: int
    timeout_s: int
    data: bool = False


_TORCH = {"torch": "torch", "torchvision": "torchvision", "numpy": "numpy", "PIL": "pillow", "yaml": "pyyaml"}
# zoo cards and recipes are pydantic models: both commands load them
_PYDANTIC = {
    "pydantic": "pydantic",
    "pydantic_core": "pydantic-core",
    "annotated_types": "annotated-types",
    "typing_inspection": "typing-inspection",
    "typing_extensions": "typing-extensions",
}
COMMANDS = {
    "bench": Command(
        {
            **_TORCH,
            "timm": "timm",
            "onnx": "onnx",
            "onnxruntime": "onnxruntime",
            "matplotlib": "matplotlib",
            "torch_pruning": "torch-pruning",
            **_PYDANTIC,
        },
        carry=(".whl",),
        budget_s=330,
        timeout_s=420,
    ),
    "speed": Command(
        {
            **_TORCH,
            "typer": "typer",
            "rich": "rich",
            "torch_pruning": "torch-pruning",  # the stage registry loads the prune stage
            **_PYDANTIC,
        },
        carry=(".whl", ".data/cifar10-xz"),
        budget_s=220,
        timeout_s=270,
        data=True,
    ),
}
# Imported whole by the preflight: small, free of torch, and the likeliest to break on another
# Python (a compiled core built for the wrong interpreter, a typing-extensions too old).
IMPORT_NOW = ("pydantic",)


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _unmet_requirements(dist: str) -> list[str]:
    """Requirements of an installed distribution that the installed versions do not meet."""
    try:
        from packaging.requirements import Requirement
        from packaging.version import Version
    except ImportError:  # nothing to check with; the import test below still runs
        return []
    unmet = []
    for text in metadata.requires(dist) or []:
        req = Requirement(text)
        if req.marker and not req.marker.evaluate({"extra": ""}):
            continue
        try:
            have = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            unmet.append(f"{req} (absent)")
            continue
        if req.specifier and Version(have) not in req.specifier:
            unmet.append(f"{req} (have {have})")
    return unmet


def _has_gpu() -> bool:
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):  # a hung or broken driver tool: no usable GPU
            return False
        return out.returncode == 0 and "GPU" in out.stdout
    return bool(glob.glob("/dev/nvidia[0-9]*"))


def preflight(name: str, device: str = "cuda", import_now: bool = True, data: Path = DATA_PACK) -> list[str]:
    """What stops command `name` here, one phrase each (empty: ready). Finds modules without
    importing them, so it takes milliseconds; imports only IMPORT_NOW (unless import_now=False:
    for checking cp312 wheels from another Python)."""
    command, problems = COMMANDS[name], []
    for module, dist in command.modules.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            where = (
                f"=={WHEELS[dist]}: carry .whl (make gpu-wheels)" if dist in WHEELS else ": part of the machine's image"
            )
            problems.append(f"no module {module} ({dist}{where})")
            continue
        if dist in WHEELS:
            problems += [f"{dist} needs {r}" for r in _unmet_requirements(dist)]
    for module in IMPORT_NOW if import_now else ():
        if module in command.modules and not any(module in p for p in problems):
            try:
                importlib.import_module(module)
            except Exception as exc:  # noqa: BLE001  (any failure here is the answer)
                problems.append(f"import {module} failed: {one_line(exc, 200)}")
    if command.data and not _zips(Path(data)):
        problems.append(f"no CIFAR-10 zips (or .xz) in {data}: carry .data/cifar10-xz (make gpu-data)")
    if device == "cuda" and not _has_gpu():
        problems.append("no NVIDIA GPU (nvidia-smi -L lists none)")
    return problems


def _zips(folder: Path) -> list[Path]:
    """The two CIFAR-10 zips in folder, xz-compressed (what travels) or plain; [] if either is missing."""
    for suffix in (".xz", ""):
        found = [folder / (z + suffix) for z in CIFAR_ZIPS]
        if all(p.is_file() for p in found):
            return found
    return []


def install_wheels(site: str = GPU_SITE, wheel_dir: Path = WHEEL_DIR) -> str:
    """Install the carried wheels into `site` (once per set of wheels) and put it first on the
    import path of this process and of the processes it starts. Says what it did."""
    wheels = sorted(glob.glob(str(wheel_dir / "*.whl")))
    if wheels:
        stamp = Path(site) / ".effvision-wheels"
        listing = "\n".join(Path(w).name for w in wheels)
        if not stamp.is_file() or stamp.read_text() != listing:
            cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
            cmd += ["--no-cache-dir", "--upgrade", "--target", site, *wheels]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode:
                tail = (done.stderr.strip().splitlines() or ["pip failed"])[-1]
                raise SystemExit(f"effvision: preflight failed: installing {wheel_dir.name}/*.whl: {tail}")
            stamp.write_text(listing)
    for path in (str(REPO), site):
        if path not in sys.path:
            sys.path.insert(0, path)
    os.environ["PYTHONPATH"] = os.pathsep.join([site, str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    return f"{len(wheels)} wheels in {site}" if wheels else f"no {wheel_dir.name}/*.whl carried"


def check(name: str, device: str, data: Path = DATA_PACK) -> None:
    """Stop with one line when command `name` cannot run here."""
    t = time.perf_counter()
    problems = preflight(name, device, data=data)
    if problems:
        raise SystemExit(f"effvision: preflight failed for {name}: {'; '.join(problems)}")
    print(f"preflight {name}: ok in {time.perf_counter() - t:.2f} s ({device})", flush=True)


def unpack_data(source: Path, dest: str) -> str:
    """The folder holding the two CIFAR-10 zips: dest, unpacked from the carried .xz files, or
    source itself when it holds them plain."""
    import lzma

    packed = _zips(Path(source))
    if not packed[0].name.endswith(".xz"):
        return str(source)
    Path(dest).mkdir(parents=True, exist_ok=True)
    for src in packed:
        target = Path(dest) / src.name[: -len(".xz")]
        if not target.is_file():
            with lzma.open(src) as fin, open(f"{target}.part", "wb") as fout:
                shutil.copyfileobj(fin, fout, 1 << 20)
            os.replace(f"{target}.part", target)
    return dest


def pack_data(src: str, dest: str) -> None:
    """Here: xz the two CIFAR-10 zips (their JPEG headers repeat, so they shrink about 3x)."""
    import lzma

    Path(dest).mkdir(parents=True, exist_ok=True)
    for name in CIFAR_ZIPS:
        source, target = Path(src) / name, Path(dest) / (name + ".xz")
        if not source.is_file():
            raise SystemExit(f"effvision: error: {source} not found")
        with open(source, "rb") as fin, lzma.open(f"{target}.part", "wb", preset=6) as fout:
            shutil.copyfileobj(fin, fout, 1 << 20)
        os.replace(f"{target}.part", target)
        print(f"{target}: {target.stat().st_size / 2**20:.1f} MiB (from {source.stat().st_size / 2**20:.1f})")


def run_bench(args, extra: list[str]) -> int:
    began = time.perf_counter()
    print(install_wheels(wheel_dir=Path(args.wheels)), flush=True)
    check("bench", args.device)
    try:
        from .studies.deploy_suite import main as suite_main
    except Exception as exc:  # noqa: BLE001  (a library built for another torch raises anything)
        raise SystemExit(f"effvision: cannot load the suite: {one_line(exc)}") from None

    variant = REPO / "runs" / "resnet18_cifar10" / "stages" / "4-distill" / "model.pt"
    left = args.budget - (time.perf_counter() - began)
    argv = ["gpu", "--out", args.out, "--work", args.work, "--budget", f"{left:.0f}"]
    argv += ["--weights", f"resnet18-pruned-distilled={variant}"] if variant.is_file() else []
    argv += ["--device", args.device] if args.device != "cuda" else []
    return suite_main(argv + extra)


def run_speed(args, extra: list[str]) -> int:
    """The speed recipe's h200 preset, seeds one after another; time_to_accuracy.json (written
    after every seed) is copied into --out, the run folders stay outside it."""
    began = time.perf_counter()
    print(install_wheels(wheel_dir=Path(args.wheels)), flush=True)
    check("speed", args.device, Path(args.data))
    root = unpack_data(Path(args.data), str(Path(args.work) / "data"))
    run_dir = Path(args.work) / "speedrun-h200"
    cmd = [sys.executable, "-m", "effvision.cli", "train", "compress/cifar10-speedrun.yaml", "--preset", "h200"]
    cmd += ["--set", f"data.root={root}", "--target-accuracy", str(args.target), "--seeds", str(args.seeds)]
    cmd += ["--run-dir", str(run_dir)] + [x for kv in args.set for x in ("--set", kv)] + extra
    left = args.budget - (time.perf_counter() - began)
    print(f"data in {root}; {left:.0f} s left: {' '.join(cmd[2:])}", flush=True)
    proc = subprocess.Popen(cmd, cwd=REPO)
    try:
        code = proc.wait(timeout=max(left, 1))
    except subprocess.TimeoutExpired:
        proc.terminate()  # the seeds already done are on disk
        try:
            code = proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        print(f"speed run stopped at its budget ({args.budget:.0f} s)", flush=True)
    summary = run_dir / "time_to_accuracy.json"
    if summary.is_file():
        Path(args.out).mkdir(parents=True, exist_ok=True)
        shutil.copy(summary, Path(args.out) / summary.name)
        print(f"wrote {Path(args.out) / summary.name}", flush=True)
    return code


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before anything imports huggingface_hub: no network there
    os.environ.setdefault("EFFVISION_QUIET", "1")  # no progress bars in a log read back as text
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(prog="python3 -m effvision.gpu_plan", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="step", required=True)
    pre = sub.add_parser("preflight", help="check one command's imports, wheels, data and GPU (milliseconds)")
    pre.add_argument("command", choices=sorted(COMMANDS))
    pre.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    pre.add_argument("--data", default=str(DATA_PACK), help="folder with the CIFAR-10 zips (.xz or plain)")
    for name, helptext in (("bench", "the GPU deployment suite"), ("speed", "the h200 speed run to 94%")):
        p = sub.add_parser(name, help=helptext + " (arguments after -- go to the underlying command)")
        p.add_argument("--out", default=os.environ.get("OUT") or f"runs/gpu-{name}", help="results only")
        p.add_argument("--work", default=f"/tmp/effvision-gpu-{name}", help="artifacts and run folders")
        p.add_argument("--budget", type=float, default=COMMANDS[name].budget_s, help="seconds, this command whole")
        p.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: a rehearsal")
        p.add_argument("--wheels", default=str(WHEEL_DIR), help="install the wheels in this folder first")
        if name == "speed":
            p.add_argument("--seeds", type=int, default=3)
            p.add_argument("--data", default=str(DATA_PACK), help="folder with the CIFAR-10 zips (.xz or plain)")
            p.add_argument("--target", type=float, default=0.94)
            p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="recipe override")
    sub.add_parser("wheels", help="print the pinned wheels the plan carries")
    pack = sub.add_parser("pack-data", help="xz the CIFAR-10 zips for the transfer")
    pack.add_argument("src")
    pack.add_argument("dest", nargs="?", default=str(DATA_PACK))
    args = parser.parse_args(argv)
    if args.step == "preflight":
        check(args.command, args.device, Path(args.data))
        return 0
    if args.step == "wheels":
        print(" ".join(f"{d}=={v}" for d, v in WHEELS.items()))
        return 0
    if args.step == "pack-data":
        pack_data(args.src, args.dest)
        return 0
    return (run_bench if args.step == "bench" else run_speed)(args, extra)


if __name__ == "__main__":
    sys.exit(main())
