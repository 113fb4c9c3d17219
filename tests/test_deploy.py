"""Deployment: verified exports (ONNX fp32/fp16/int8, ExecuTorch), the benchmark harness across
backends and precisions, device/timer/memory probes, the roofline, suites and result files.
GPU paths run where CUDA exists and skip cleanly elsewhere; their CPU-side logic (device
selection, timer fallback, precision switches) is tested here on the CPU."""

import json
import mmap
import time
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from effvision.cli import main
from effvision.deploy import bench_model, benchmark, cpu_ceiling, export_verified
from effvision.deploy.backends import check_pair, supported_pairs
from effvision.deploy.results import write_results
from effvision.deploy.roofline import Roofline, copy_bandwidth, matmul_peak
from effvision.deploy.torch_precision import input_dtype, math_mode, prepare_model
from effvision.device import PeakMemory, Timer, resolve_device
from effvision.errors import EffvisionError
from effvision.models import create_model
from effvision.runtimes.executorch import executorch_missing
from effvision.runtimes.onnx_files import export_onnx, failing_operator

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
needs_executorch = pytest.mark.skipif(executorch_missing() is not None, reason=str(executorch_missing()))
SHAPE = [3, 32, 32]


def small_net(classes: int = 10) -> nn.Module:
    """A timm MobileNetV3 at quarter width: real depthwise/SE/hardswish layers, quick to export."""
    return create_model("timm:mobilenetv3_small_050", num_classes=classes).eval()


def loader(n: int = 48, batch: int = 16, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.rand(batch, *SHAPE, generator=g) * 2 - 1, torch.zeros(batch, dtype=torch.long))
        for _ in range(n // batch)
    ]


# --------------------------------------------------------------------------- device, timer, memory
def test_device_selection_and_errors():
    assert resolve_device("cpu").type == "cpu"
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(EffvisionError, match="unknown device"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(EffvisionError, match="no CUDA GPU"):
            resolve_device("cuda")


def test_cpu_timer_and_peak_rss_follow_the_work():
    import sys

    timer = Timer("cpu")
    assert timer.kind == "perf_counter"
    assert 4.0 <= timer.time(lambda: time.sleep(0.005)) < 500  # milliseconds, at least the sleep
    with PeakMemory("cpu") as before:
        pass
    with PeakMemory("cpu") as big:
        block = torch.ones(64 << 20, dtype=torch.uint8)  # 64 MiB touched
        del block
    with PeakMemory("cpu") as after:
        pass
    assert before.result()["kind"] == "peak_rss"
    if sys.platform == "linux":  # /proc/self/clear_refs resets the peak: each block is measured alone
        assert big.result()["scope"] == after.result()["scope"] == "block", big.result()
    if big.result()["scope"] == "block":
        # the 64 MiB shows in its own block and not in the blocks around it (a process-wide peak
        # would carry it into `after`)
        assert big.result()["bytes"] - before.result()["bytes"] > 48 << 20, (before.result(), big.result())
        assert big.result()["bytes"] - after.result()["bytes"] > 48 << 20, (big.result(), after.result())


@needs_cuda
def test_cuda_timer_and_memory_use_events():
    timer = Timer("cuda")
    assert timer.kind == "cuda-event"
    a = torch.randn(2048, 2048, device="cuda")
    assert timer.time(lambda: a @ a) > 0
    with PeakMemory("cuda") as mem:
        torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    assert mem.result()["kind"] == "cuda_max_allocated" and mem.result()["bytes"] >= 256 << 20


# --------------------------------------------------------------------------- precision switches
def test_precision_switches_on_cpu():
    net = small_net()
    half, _ = prepare_model(net, "bf16", torch.device("cpu"), torch.zeros(1, *SHAPE))
    assert next(half.parameters()).dtype == torch.bfloat16 and next(net.parameters()).dtype == torch.float32  # a copy
    cl, _ = prepare_model(net, "fp32", torch.device("cpu"), torch.zeros(1, *SHAPE), channels_last=True)
    conv = next(m for m in cl.modules() if isinstance(m, nn.Conv2d) and m.kernel_size[0] > 1)
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)
    assert input_dtype("fp16", torch.device("cuda")) == torch.float16
    assert input_dtype("int8", torch.device("cuda")) == torch.bfloat16  # torchao GPU models take bf16
    assert input_dtype("int8", torch.device("cpu")) == torch.float32
    before = torch.backends.cuda.matmul.allow_tf32
    with math_mode("tf32"):
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    with math_mode("fp32"):
        assert not torch.backends.cuda.matmul.allow_tf32
    assert torch.backends.cuda.matmul.allow_tf32 == before


def test_unsupported_pairs_list_the_supported_ones():
    with pytest.raises(EffvisionError) as err:
        check_pair("torch-eager", "int8", torch.device("cpu"))
    msg = str(err.value)
    assert (
        "does not run int8 on cpu" in msg
        and "onnxruntime-cpu: fp32, fp16, int8" in msg
        and "torch-compile: fp32, bf16, int8" in msg
    )
    with pytest.raises(EffvisionError, match="float8"):
        check_pair("onnxruntime-cpu", "float8", torch.device("cpu"))
    assert "float8" in supported_pairs("cuda") and "onnxruntime-cuda" in supported_pairs("cuda")


# --------------------------------------------------------------------------- roofline
def test_roofline_measures_matmul_peak_and_bandwidth():
    peak = matmul_peak("cpu", "fp32", n=256, repeats=3)
    assert peak["flops_per_s"] > 1e8 and peak["n"] == 256
    assert copy_bandwidth("cpu", nbytes=16 << 20, repeats=3)["bytes_per_s"] > 1e8
    assert matmul_peak("cpu", "float8") is None  # no float8 product on a CPU
    rf = Roofline("cpu", theoretical=False)
    rf.peaks["fp32"] = peak
    rf.peaks["int8"] = {"precision": "int8", "flops_per_s": 1.0}  # slower than fp32: fp32 is the ceiling
    assert rf.peak("int8")["precision"] == "fp32"


def test_roofline_peak_is_the_best_probe_and_a_beaten_probe_is_said(capsys):
    """Where no theoretical peak can be computed, ONNX Runtime's own products are probed beside
    torch's (its int8 product is the only one that reaches a CPU's int8 rate without VNNI); a row
    that still beats the probes gets no share and one line on stderr naming the figures."""
    from effvision.deploy.bench import add_roofline
    from effvision.deploy.roofline import ort_matmul_peak

    for precision in ("fp32", "int8"):
        probe = ort_matmul_peak(precision, sizes=(256,), repeats=3)
        assert probe["probe"] == "onnxruntime" and probe["flops_per_s"] > 1e8, probe
    assert ort_matmul_peak("bf16") is None
    rf = Roofline("cpu", theoretical=False)
    rf.peaks["fp32"] = {"precision": "fp32", "flops_per_s": 2e9, "probe": "torch"}
    rf.peaks["int8"] = {"precision": "int8", "flops_per_s": 4e9, "probe": "onnxruntime"}
    row = add_roofline({"backend": "onnxruntime-cpu", "precision": "int8", "batch": 1, "p50": 1.0}, 1e6, rf)
    assert row["fraction_of_peak"] == pytest.approx(0.5) and row["peak_probe"] == "onnxruntime"
    # a peak probed in a busy moment is probed again before any row is judged against it
    row = add_roofline({"backend": "onnxruntime-cpu", "precision": "fp32", "batch": 1, "p50": 1.0}, 2e6, rf)
    assert 0 < row["fraction_of_peak"] <= 1 and rf.peaks["fp32"]["flops_per_s"] > 4e9
    assert capsys.readouterr().err == ""
    rf._probe = lambda precision: None  # probes that cannot reach what a model does: the row says so
    row = add_roofline({"backend": "onnxruntime-cpu", "precision": "fp32", "batch": 1, "p50": 1e-3}, 1e9, rf)
    assert row["fraction_of_peak"] is None and row["peak_exceeded"]
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "2000000.0 GFLOP/s" in err and " probe)" in err and "bug" not in err


def test_cpu_ceiling_from_instruction_set_cpus_and_clock(monkeypatch):
    """Two of the widest multiply-add instructions per cycle on every CPU, at the clock read: the
    figures a datasheet gives (e.g. 64 fp32 FLOP/cycle for AVX-512 FMA, 2,048 int8 ops for AMX)."""
    clock = (2.0e9, "a test clock")
    avx2 = {"sse2", "avx", "fma", "avx2"}
    avx512 = avx2 | {"avx512f", "avx512bw", "avx512_vnni"}
    assert cpu_ceiling.ceiling("fp32", avx512, 2, clock)["flops_per_s"] == 2 * 64 * 2e9
    assert cpu_ceiling.ceiling("fp32", avx2, 2, clock)["flops_per_s"] == 2 * 32 * 2e9
    assert cpu_ceiling.ceiling("int8", avx512, 2, clock)["flops_per_s"] == 2 * 256 * 2e9
    assert cpu_ceiling.ceiling("int8", avx512 | {"amx_int8"}, 1, clock)["flops_per_s"] == 2048 * 2e9
    assert cpu_ceiling.ceiling("int8", avx2, 4, clock)["flops_per_s"] == 4 * 128 * 2e9
    # a precision without instructions of its own is capped by fp32's rate, never below it
    assert cpu_ceiling.ceiling("bf16", avx512, 2, clock)["flops_per_s"] == 2 * 64 * 2e9
    how = cpu_ceiling.ceiling("fp32", avx512, 2, clock)["how"]
    assert "2 CPUs" in how and "AVX-512 FMA" in how and "a test clock" in how
    # no readable instruction set (not x86) or clock: no theoretical ceiling, the probes stand in
    assert cpu_ceiling.ceiling("fp32", {"asimd"}, 2, clock) is None
    monkeypatch.setattr(cpu_ceiling, "clock_hz", lambda: None)
    assert cpu_ceiling.ceiling("fp32", avx512, 2) is None
    rf = Roofline("cpu")
    rf._probe = lambda precision: {"precision": precision, "flops_per_s": 5e9, "probe": "torch", "n": 256}
    assert rf.peak("fp32")["probe"] == "torch" and not rf.theoretical


@pytest.mark.skipif(
    cpu_ceiling.ceiling("fp32") is None,
    reason="this CPU's instruction set or clock cannot be read: bench falls back to the probes",
)
def test_no_measured_product_beats_the_theoretical_ceiling():
    """The ceiling is one: torch's and ONNX Runtime's fastest matrix products, fp32 and int8, stay
    below this CPU's computed peak (a ceiling from too few ops per cycle fails here)."""
    from effvision.deploy.roofline import ort_matmul_peak

    rf = Roofline("cpu")
    for precision in ("fp32", "int8"):
        ceiling = rf.peak(precision)
        assert ceiling["probe"] == "theoretical", ceiling
        for probe in (matmul_peak("cpu", precision, repeats=3), ort_matmul_peak(precision, repeats=3)):
            if probe:
                assert probe["flops_per_s"] <= ceiling["flops_per_s"], (probe, ceiling)
    assert rf.summary()["peak_how"]["fp32"] == rf.peak("fp32")["how"]


def test_rows_measured_before_a_peak_was_probed_again_take_the_final_peak():
    """A row that beats the peak has the probes run again; the rows measured before it are divided
    by the new, higher peak as well (make test beside a training run: 219 against 239 GFLOP/s)."""
    from effvision.deploy.bench import add_roofline, settle_shares

    rf = Roofline("cpu", theoretical=False)
    rf.peaks["fp32"] = {"precision": "fp32", "flops_per_s": 4e9, "probe": "torch"}
    rf._probe = lambda precision: {"precision": "fp32", "flops_per_s": 8e9, "probe": "onnxruntime"}
    first = add_roofline({"backend": "onnxruntime-cpu", "precision": "fp32", "batch": 1, "p50": 1.0}, 1e6, rf)
    assert first["fraction_of_peak"] == pytest.approx(0.5)  # 2 of 4 GFLOP/s: no probe again
    second = add_roofline({"backend": "onnxruntime-cpu", "precision": "fp32", "batch": 1, "p50": 1.0}, 3e6, rf)
    assert second["fraction_of_peak"] == pytest.approx(0.75) and rf.peaks["fp32"]["flops_per_s"] == 8e9
    settle_shares([first, second], rf)
    assert first["peak_flops_per_s"] == 8e9 and first["fraction_of_peak"] == pytest.approx(0.25)
    assert first["peak_probe"] == "onnxruntime" and second["fraction_of_peak"] == pytest.approx(0.75)


# --------------------------------------------------------------------------- exports
@pytest.fixture(scope="module")
def net():
    return small_net()


@pytest.fixture(scope="module")
def quick_net():
    """effvision's CIFAR ResNet-8: exports in about 3 s where the MobileNetV3 takes 13 s, for
    tests about the harness rather than about operators."""
    return create_model("cifar_resnet8", num_classes=10).eval()


@pytest.fixture(scope="module")
def trained():
    """A CIFAR ResNet-8 trained briefly on digits (about 10 s) with its calibration and validation
    loaders: logits spread over ~10 with real margins between classes, where a random-init net's
    spread is ~0.01 and any file (even an all-zero int8 one) would pass a fixed logit limit."""
    from effvision.data import load_dataset
    from effvision.recipe import DataConfig
    from effvision.train import TrainSettings, fit

    data = load_dataset(DataConfig(name="digits", max_train_samples=400, max_val_samples=120, batch_size=32))
    torch.manual_seed(0)
    model = create_model("cifar_resnet8", num_classes=10)
    fit(model, data, TrainSettings(epochs=4, optimizer="adamw", lr=3e-3), torch.device("cpu"))
    model.effvision_spec["data"] = {"name": "digits"}  # as the pipeline records it in a checkpoint
    with torch.no_grad():
        logits = torch.cat([model.eval()(x) for x, _ in data.val_loader()])
    return SimpleNamespace(
        model=model.eval(),
        data=data,
        calib=data.train_eval_loader(range(64), batch_size=16),
        val=data.val_loader(),
        spread=float(logits.max() - logits.min()),
    )


def assert_parity(fig: dict, spread: float, max_rel: float, mean_rel: float, agreement: float) -> None:
    """An exported artifact agrees with PyTorch: top-1 on at least `agreement` of the samples, and
    logit differences (max and mean) within fractions of the model's logit spread."""
    assert fig["top1_agreement"] >= agreement, fig
    assert fig["max_abs_diff"] <= max_rel * spread and fig["mean_abs_diff"] <= mean_rel * spread, (spread, fig)


# per precision: max and mean |logit difference| as fractions of the logit spread, top-1 agreement
# (measured on the trained ResNet-8, spread 10.1: fp32 2e-7 max; fp16 5e-4 max; int8 ONNX 0.08 max, 0.004 mean,
# 0.975 agreement; int8 ExecuTorch 0.08 max, 0.003 mean, 0.99 agreement)
PARITY = {"fp32": (1e-4, 1e-5, 1.0), "fp16": (1e-2, 1e-3, 0.98), "int8": (0.25, 0.02, 0.9)}


def test_onnx_exports_are_verified_and_figures_saved_beside(tmp_path, trained):
    assert trained.spread > 5, trained.spread  # real margins, or the limits below say nothing
    for precision in ("fp32", "fp16", "int8"):
        path, fig = export_verified(
            trained.model,
            "onnx",
            precision,
            tmp_path / f"m.{precision}.onnx",
            SHAPE,
            trained.calib,
            trained.val,
            data="digits",
        )
        saved = json.loads((tmp_path / f"m.{precision}.onnx.parity.json").read_text())
        assert saved == json.loads(json.dumps(fig)) and saved["samples"] == 120 and saved["precision"] == precision
        assert_parity(saved, trained.spread, *PARITY[precision])
    sizes = {p: (tmp_path / f"m.{p}.onnx").stat().st_size for p in ("fp32", "fp16", "int8")}
    assert sizes["int8"] < sizes["fp16"] < sizes["fp32"]
    from effvision.runtimes.onnx_files import onnx_precision

    assert [onnx_precision(tmp_path / f"m.{p}.onnx") for p in ("fp32", "fp16", "int8")] == ["fp32", "fp16", "int8"]


@pytest.mark.slow  # one lowering, about 40 s on 2 cores (make test's budget)
@needs_executorch
def test_executorch_exports_run_and_agree(tmp_path, net):
    # a fixed-batch program, checked for agreement and benchmarked
    _, fixed = export_verified(net, "executorch", "fp32", tmp_path / "b4.pte", SHAPE, loader(), loader(seed=1), batch=4)
    assert fixed["max_abs_diff"] < 1e-3 and fixed["top1_agreement"] == 1.0 and fixed["samples"] == 48
    from effvision.runtimes.executorch import pte_input_shape

    assert pte_input_shape(tmp_path / "b4.pte") == [4, *SHAPE]
    rows = benchmark(tmp_path / "b4.pte", SHAPE, "executorch", "fp32", (4,), "cpu", warmup=1, repeats=3)
    assert rows[0]["program_batch"] == 4 and rows[0]["p50"] > 0
    with pytest.raises(EffvisionError, match="exported for batch 4, not 2"):
        benchmark(tmp_path / "b4.pte", SHAPE, "executorch", "fp32", (2,), "cpu", warmup=1, repeats=3)


@pytest.mark.slow  # XNNPACK int8 lowering: about 20 s on 2 cores
@needs_executorch
def test_executorch_int8_export_runs_and_shrinks(tmp_path, trained):
    model = trained.model
    _, int8 = export_verified(
        model, "executorch", "int8", tmp_path / "q.pte", SHAPE, trained.calib, trained.val, batch=4
    )
    fp32_bytes = sum(p.numel() * 4 for p in model.parameters())
    assert int8["samples"] == 120 and int8["size_bytes"] < 0.5 * fp32_bytes
    assert_parity(int8, trained.spread, *PARITY["int8"])


@pytest.mark.skipif(executorch_missing() is None, reason="ExecuTorch is installed")
def test_executorch_missing_says_why(tmp_path, net):
    with pytest.raises(EffvisionError, match="ExecuTorch is not usable"):
        export_verified(net, "executorch", "fp32", tmp_path / "m.pte", SHAPE, loader(), loader())


@torch.library.custom_op("effvision_test::twist", mutates_args=())
def _twist(x: torch.Tensor) -> torch.Tensor:
    return x.flip(-1)


@_twist.register_fake
def _(x):
    return torch.empty_like(x)


class Twisted(nn.Module):
    effvision_spec = {"input_size": [3, 8, 8]}

    def forward(self, x):
        return _twist(x).mean((2, 3))


def test_export_failure_names_the_operator(tmp_path):
    with pytest.raises(EffvisionError) as err:
        export_onnx(Twisted(), tmp_path / "t.onnx")
    assert "effvision_test.twist" in str(err.value) and "\n" not in str(err.value)
    assert failing_operator("No ONNX function found for <OpOverload(op='aten.foo', overload='default')>") == "aten.foo"
    assert failing_operator("something else broke") is None


# --------------------------------------------------------------------------- the harness
class Sleeper(nn.Module):
    """Known work per call: at least 20 ms of wall time and 32 MiB of fresh memory touched (and freed)."""

    resident_at_call: list[int] = []  # the resident set as each call began (on the class: the harness copies models)

    def forward(self, x):
        from effvision.device import resident_bytes

        Sleeper.resident_at_call.append(resident_bytes())
        time.sleep(0.02)
        # an anonymous mapping of its own: late in a session the allocator would hand back pages
        # already resident from earlier tests, and the resident set would not grow
        with mmap.mmap(-1, 32 << 20) as block:
            pages = torch.frombuffer(block, dtype=torch.uint8)
            pages.fill_(1)
            last = float(pages[-1])
            del pages
        return x.flatten(1)[:, :10] + last


def conv_linear_macs(model: nn.Module, shape: list[int]) -> int:
    """Multiply-accumulates of a net's convolutions and linear layers, counted from the layer
    shapes seen in one forward pass (independently of torch-pruning's counter)."""
    total = [0]

    def count(mod, args, out):
        if isinstance(mod, nn.Conv2d):
            total[0] += out[0].numel() * mod.in_channels // mod.groups * mod.kernel_size[0] * mod.kernel_size[1]
        else:
            total[0] += mod.in_features * mod.out_features

    handles = [m.register_forward_hook(count) for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    with torch.no_grad():
        model(torch.zeros(1, *shape))
    for h in handles:
        h.remove()
    return total[0]


def test_harness_reports_latency_memory_flops_and_share_of_peak(tmp_path, quick_net):
    from effvision.models import count_macs

    # the timer and the memory probe see the work of each call: 20 ms (plus filling 32 MiB) and 32 MiB
    Sleeper.resident_at_call.clear()
    known = benchmark(Sleeper(), SHAPE, "torch-eager", "fp32", (2,), "cpu", warmup=1, repeats=5)[0]
    assert 20 <= known["p50"] < 100, known  # one call: not nothing, not the five repeats together
    assert known["samples_per_s"] == pytest.approx(2e3 / known["p50"], rel=1e-3)
    if known["peak_memory"]["scope"] == "block":
        # against the resident set inside the block: before it the process may hold garbage it frees on the way
        start = min(Sleeper.resident_at_call[-5:])
        assert known["peak_memory"]["bytes"] - start > 24 << 20, (start, known["peak_memory"])
    net = quick_net
    macs = count_macs(net, SHAPE)  # what `effvision bench` passes
    assert conv_linear_macs(net, SHAPE) <= macs <= 1.02 * conv_linear_macs(net, SHAPE)  # plus norms, adds
    rf = Roofline("cpu")
    # ExecuTorch runs through the same harness in test_executorch_exports_run_and_agree
    pairs = [("torch-eager", "fp32"), ("onnxruntime-cpu", "fp32"), ("onnxruntime-cpu", "int8")]
    rows = bench_model(net, SHAPE, pairs, batches=(1, 4), device="cpu", warmup=1, repeats=5, macs=macs, roofline=rf)
    assert [(r["backend"], r["precision"], r["batch"]) for r in rows] == [(b, p, n) for b, p in pairs for n in (1, 4)]
    for r in rows:
        assert 0 < r["p50"] <= r["p90"] <= r["p99"] and r["timer"] == "perf_counter" and r["peak_memory"]["bytes"] > 0
        # throughput and achieved FLOP/s follow from the measured median for the row's batch, and
        # the share of peak is against the roofline's ceiling (this CPU's theoretical peak where readable)
        assert r["samples_per_s"] == pytest.approx(r["batch"] * 1e3 / r["p50"], rel=1e-3)
        assert r["flops_per_sample"] == 2 * macs
        assert r["achieved_flops_per_s"] == pytest.approx(2 * macs * r["batch"] * 1e3 / r["p50"], rel=1e-6)
        peak = rf.peak(r["precision"])["flops_per_s"]
        assert r["peak_flops_per_s"] == peak and r["fraction_of_peak"] == pytest.approx(
            r["achieved_flops_per_s"] / peak
        )
        assert 0 < r["fraction_of_peak"] <= 1, r  # a ceiling: no model beats it
        assert r["peak_probe"] == "theoretical" or cpu_ceiling.ceiling("fp32") is None, r
    assert rf.summary()["copy_bytes_per_s"] > 0 and rf.summary()["matmul_flops_per_s"]["fp32"] > 0
    paths = write_results([{"model": "net", **r} for r in rows], tmp_path / "out", {"note": "test"})
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = paths["md"].read_text()
    assert "| net | onnxruntime-cpu | int8 | 4 |" in md and "bench.png" in md
    assert json.loads(paths["json"].read_text())["note"] == "test"


@pytest.mark.slow  # inductor compiles C++ twice: about 45 s on 2 cores
def test_torch_compile_and_pt2e_int8_on_cpu(net):
    rows = bench_model(
        net,
        SHAPE,
        [("torch-compile", "fp32"), ("torch-compile", "int8")],
        batches=(2,),
        device="cpu",
        warmup=1,
        repeats=3,
    )
    assert [r["precision"] for r in rows] == ["fp32", "int8"] and rows[1]["quantization"].startswith("pt2e")
    assert all(r["first_call_ms"] > r["p50"] for r in rows)  # the first call compiles


def record_layouts(net: nn.Module) -> tuple[list, list, list]:
    """Forward pre-hooks (they travel with the copy a backend makes) recording, at every call, the
    dtype and channels-last layout of the network's input and stem weight, and of the activation
    an inner convolution is given: (outer, inner, handles)."""
    stem, inner = net.conv_stem, net.blocks[1][0].conv_dw  # a 16x3x3x3 weight; 40 channels at 8x8
    outer, conv = [], []

    def layout(t: torch.Tensor) -> tuple:
        return t.dtype, t.is_contiguous(memory_format=torch.channels_last)

    handles = [
        stem.register_forward_pre_hook(lambda mod, args: outer.append((layout(args[0]), layout(mod.weight)))),
        inner.register_forward_pre_hook(lambda mod, args: conv.append(layout(args[0]))),
    ]
    return outer, conv, handles


def test_channels_last_and_bf16_on_cpu(net):
    outer, conv, handles = record_layouts(net)
    try:
        rows = benchmark(net, SHAPE, "torch-eager", "bf16", (2,), "cpu", channels_last=True, warmup=1, repeats=3)
    finally:
        for h in handles:
            h.remove()
    assert rows[0]["channels_last"] and rows[0]["precision"] == "bf16"
    # every call (first, warm-up, timed) ran in bf16 and channels-last, from the input to the weights
    assert len(outer) == len(conv) == 1 + 1 + 3
    assert set(outer) == {((torch.bfloat16, True), (torch.bfloat16, True))}, outer  # (input, stem weight)
    assert set(conv) == {(torch.bfloat16, True)}, conv  # an activation inside the network
    assert next(net.parameters()).dtype == torch.float32  # the benchmark ran a copy


def observe_runs(monkeypatch, backend: str) -> list:
    """Wrap what a torch backend runs, recording at every call (outside any compiled graph) the
    input's device, dtype and layout, the stem weight's dtype and layout, the TF32 switches in
    force and the output's dtype."""
    from effvision.deploy.backends import BACKENDS

    cls, calls = BACKENDS.get(backend), []
    wrap = cls.wrap

    def observed(self, model, opts):
        fn, weight = wrap(self, model, opts), model.conv_stem.weight

        def run(x):
            out = fn(x)
            calls.append(
                {
                    "device": x.device.type,
                    "input": (x.dtype, x.is_contiguous(memory_format=torch.channels_last)),
                    "weight": (weight.dtype, weight.is_contiguous(memory_format=torch.channels_last)),
                    "tf32": (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32),
                    "output": out.dtype,
                }
            )
            return out

        return run

    monkeypatch.setattr(cls, "wrap", observed)
    return calls


DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def check_ran_as_asked(calls: list, rows: list, device: str, precision: str, model: nn.Module, rf) -> None:
    """Every call ran on `device` in `precision` and channels-last, TF32 on only for tf32; each
    row's memory holds at least the weights in that precision; its share of peak is against the
    roofline's measured peak for the precision."""
    dtype, tf32 = DTYPES[precision], precision == "tf32"
    assert len(calls) == sum(1 + r["warmup"] + r["repeats"] for r in rows)
    assert all(
        c["device"] == device
        and c["input"] == (dtype, True)
        and c["weight"] == (dtype, True)
        and c["tf32"] == (tf32, tf32)
        and c["output"] == dtype
        for c in calls
    ), calls[:2]
    weight_bytes = sum(p.numel() for p in model.parameters()) * torch.empty(0, dtype=dtype).element_size()
    for r in rows:
        assert r["peak_memory"]["bytes"] >= weight_bytes, (r["peak_memory"], weight_bytes)
        assert r["peak_flops_per_s"] == rf.peak(precision)["flops_per_s"] and r["fraction_of_peak"] == pytest.approx(
            r["achieved_flops_per_s"] / rf.peak(precision)["flops_per_s"]
        )


@needs_cuda
@pytest.mark.parametrize(
    "backend,precision,mode",
    [
        ("torch-eager", "fp32", "default"),
        ("torch-eager", "tf32", "default"),
        ("torch-eager", "fp16", "default"),
        ("torch-compile", "bf16", "reduce-overhead"),
    ],
)
def test_gpu_backends(net, backend, precision, mode, monkeypatch):
    calls, rf = observe_runs(monkeypatch, backend), Roofline("cuda")
    rows = benchmark(
        net,
        SHAPE,
        backend,
        precision,
        (1, 8),
        "cuda",
        channels_last=True,
        compile_mode=mode,
        warmup=2,
        repeats=5,
        roofline=rf,
        macs=1_000_000,
    )
    assert all(r["timer"] == "cuda-event" and r["peak_memory"]["kind"] == "cuda_max_allocated" for r in rows)
    check_ran_as_asked(calls, rows, "cuda", precision, net, rf)


@needs_cuda
@pytest.mark.parametrize("precision", ["int8", "float8"])
def test_gpu_torchao_quantization(precision):
    if precision == "float8" and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("float8 needs Ada or Hopper")
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 256), nn.ReLU(), nn.Linear(256, 10)).eval()
    rows = benchmark(model, SHAPE, "torch-eager", precision, (16,), "cuda", warmup=2, repeats=5)
    assert rows[0]["quantized_layers"] >= 1


# --------------------------------------------------------------------------- CLI
def test_cli_bench_bad_pair_and_plots(tmp_path, capsys):
    code = main(
        ["bench", "timm:mobilenetv3_small_050", "--backend", "torch-eager", "--precision", "int8", "--device", "cpu"]
    )
    err = capsys.readouterr().err
    assert (
        code == 1
        and len(err.strip().splitlines()) == 1
        and "supported on cpu:" in err
        and "onnxruntime-cpu: fp32, fp16, int8" in err
    )
    code = main(
        [
            "bench",
            "cifar_resnet8",
            "--backend",
            "onnxruntime-cpu",
            "--precision",
            "fp32,fp16",
            "--batch",
            "1,2",
            "--repeats",
            "3",
            "--warmup",
            "1",
            "--input-size",
            "3,32,32",
            "--out",
            str(tmp_path / "b"),
        ]
    )
    assert code == 0, capsys.readouterr().err
    res = json.loads((tmp_path / "b/results.json").read_text())
    assert {(r["precision"], r["batch"]) for r in res["results"]} == {
        ("fp32", 1),
        ("fp32", 2),
        ("fp16", 1),
        ("fp16", 2),
    }
    assert res["roofline"]["copy_bytes_per_s"] > 0 and (tmp_path / "b/bench.png").is_file()
    code = main(["export", "cifar_resnet8", "--format", "executorch", "--precision", "fp16"])
    err = capsys.readouterr().err
    assert code == 1 and "has no precision 'fp16'" in err
    assert "executorch: fp32, int8;" in err and "onnx: fp32, fp16, int8" in err


# --------------------------------------------------------------------------- suites
def test_suite_runs_records_failures_and_budget(tmp_path, monkeypatch):
    from conftest import write_image_folder

    from effvision.studies import deploy_suite as suite

    monkeypatch.setitem(
        suite.SUITES,
        "tiny",
        {
            "device": "cpu",
            "input_size": SHAPE,
            "batches": [1, 2],
            "channels_last": False,
            "warmup": 1,
            "repeats": 3,
            "models": {"speednet": "speednet", "resnet8": "cifar_resnet8"},
            "runs": [
                ("onnxruntime-cpu", "fp32", None),
                ("onnxruntime-cpu", "int8", None),
                ("torch-eager", "int8", None),
            ],
        },
    )
    images = write_image_folder(tmp_path / "imgs", classes=("a", "b"), per_class=6, size=32)
    meta = suite.run_suite("tiny", tmp_path / "out", images=str(images), log=lambda m: None)
    res = json.loads((tmp_path / "out/results.json").read_text())
    ok = [r for r in res["results"] if r["status"] == "measured"]
    assert {(r["model"], r["precision"], r["batch"]) for r in ok} == {
        (m, p, b) for m in ("speednet", "resnet8") for p in ("fp32", "int8") for b in (1, 2)
    }
    # one cell per model and batch the CPU cannot run, listed with the reason
    unavailable = [r for r in res["results"] if r["status"] == "unavailable"]
    assert len(unavailable) == 4 and all("does not run int8 on cpu" in r["reason"] for r in unavailable)
    # one export per model and precision, beside the results, not in their folder
    assert len(res["exports"]) == 4 and all(
        e["samples"] == 8 and (tmp_path / "out-artifacts" / e["model"] / (e["artifact"] + ".parity.json")).is_file()
        for e in res["exports"]
    )
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["bench.png", "results.json", "results.md"]
    assert meta["models"]["speednet"]["macs"] > 0 and "unavailable: " in (tmp_path / "out/results.md").read_text()
    suite.run_suite("tiny", tmp_path / "late", budget_s=1e-9, log=lambda m: None)
    late = json.loads((tmp_path / "late/results.json").read_text())
    assert late["stopped"]["reason"].startswith("stopped at the time budget")
    assert all(r["status"] == "skipped" for r in late["results"] if r["status"] != "unavailable")


def test_suite_verifies_int8_at_the_size_a_checkpoint_was_trained_for(tmp_path, trained):
    from PIL import Image

    from effvision.deploy.results import parity_table
    from effvision.studies.deploy_suite import native_agreement

    # 30 real digits at 64 px in class folders: the check must bring them to the 32 px and the
    # normalisation (the digits card's) the checkpoint was trained with
    for i in range(30):
        img, label = trained.data.val[i]
        (tmp_path / "imgs" / str(label)).mkdir(parents=True, exist_ok=True)
        Image.fromarray(img.permute(1, 2, 0).numpy()).resize((64, 64)).save(tmp_path / "imgs" / str(label) / f"{i}.png")
    images, model = str(tmp_path / "imgs"), trained.model
    assert native_agreement(model, images, tmp_path / "same", [3, 32, 32]) is None  # already measured at its size
    figures = native_agreement(model, images, tmp_path / "work", [3, 224, 224])
    assert figures["input_shape"] == [3, 32, 32] and figures["precision"] == "int8" and figures["samples"] == 20
    assert (tmp_path / "work/model.int8.native.onnx.parity.json").is_file()
    assert_parity(figures, trained.spread, *PARITY["int8"])
    table = parity_table([{"model": "m", **figures}, {"model": "bad", "artifact": "x.onnx", "error": "no conversion"}])
    assert "| m | model.int8.native.onnx | 3x32x32 |" in table and "| bad | x.onnx | failed: no conversion |" in table


def test_each_compiled_model_gets_a_fresh_dynamo(monkeypatch):
    """Models of one class share dynamo's recompile limit: past it, a later model would run eager
    under a compile label. The backend resets dynamo per model (limit lowered to 1 to see it cheaply)."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    from effvision.deploy.backends import BenchOptions, backend

    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 1)
    # dynamo traces as it would for inductor; the "eager" backend skips inductor's C++ compile (seconds)
    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, **kw: real_compile(model, **{**kw, "backend": "eager"}))
    compiled = []
    for seed in (0, 1, 2):
        torch.manual_seed(seed)
        loaded = backend("torch-compile").load(nn.Sequential(nn.Linear(8, 8), nn.ReLU()), [8], BenchOptions())
        before = counters["stats"]["unique_graphs"]
        loaded.run(loaded.make_input(2))
        compiled.append(counters["stats"]["unique_graphs"] - before)
    assert compiled == [1, 1, 1], compiled  # each model traced and compiled, none fell back to eager


def test_torchao_leaves_inductor_settings_alone(monkeypatch):
    import torch._inductor.config as inductor_config
    import torchao.quantization as tq

    from effvision.deploy.torch_precision import torchao_gpu

    real = tq.quantize_

    def quantize_after_a_first_import(model, config):  # a module torchao loads on first use can set one
        inductor_config.pre_grad_custom_pass = lambda graph: None
        return real(model, config)

    monkeypatch.setattr(tq, "quantize_", quantize_after_a_first_import)
    before = inductor_config.get_config_copy()
    model, n = torchao_gpu(nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)), "int8")
    assert n == 2  # both Linear layers quantized, and said so
    changed = {k for k, v in inductor_config.get_config_copy().items() if before.get(k) != v}
    assert not changed, changed


def test_onnxruntime_cuda_refuses_a_session_that_fell_back_to_the_cpu(tmp_path, monkeypatch):
    """ONNX Runtime starts a session on the CPU, with only a warning, when the CUDA provider cannot
    start: such a row would time the CPU under a CUDA label. Here the provider is made to look
    installed and the session starts on the CPU, as it would there."""
    import effvision.runtimes.onnx_files as runtime
    from effvision.deploy.backends import BackendUnavailable, BenchOptions, backend
    from effvision.registry import BACKENDS

    OnnxRuntimeCuda = BACKENDS.get("onnxruntime-cuda")

    path = export_onnx(nn.Sequential(nn.Flatten(), nn.Linear(12, 3)), tmp_path / "m.onnx", [3, 2, 2])
    monkeypatch.setattr(OnnxRuntimeCuda, "missing", classmethod(lambda cls: None))
    real = runtime.ort_session
    monkeypatch.setattr(runtime, "ort_session", lambda p, threads=None, providers=None, spinning=True: real(p, threads))
    with pytest.raises(BackendUnavailable, match="did not start CUDAExecutionProvider"):
        backend("onnxruntime-cuda").load(path, [3, 2, 2], BenchOptions(device=torch.device("cuda")))
    assert (
        backend("onnxruntime-cpu").load(path, [3, 2, 2], BenchOptions()).notes["providers"][0] == "CPUExecutionProvider"
    )


class Paced:
    """A fake runner: `ms` per call, four times slower while the shared machine has a slow spell
    (the calls from `spell_from` on, counted over every runner of the session)."""

    def __init__(self, name, ms, log, session):
        self.name, self.ms, self.log, self.session = name, ms, log, session

    def loaded(self):
        from effvision.deploy.backends import Loaded

        return Loaded(self.run, lambda b: b)

    def run(self, x):
        self.log.append(self.name)
        self.session["calls"] += 1
        time.sleep(self.ms / 1e3 * (4 if self.session["calls"] > self.session["spell_from"] else 1))


def test_interleaved_timing_is_fair_to_both_targets():
    from effvision.deploy.bench import measure, measure_interleaved

    cpu = torch.device("cpu")
    log, session = [], {"calls": 0, "spell_from": 10**9}
    a, b = Paced("a", 2, log, session), Paced("b", 6, log, session)
    rows = measure_interleaved({"a": a.loaded(), "b": b.loaded()}, 1, cpu, warmup=1, repeats=12, rounds=4)
    # first call and warm-up of each, then blocks a b | b a | a b | b a, each an untimed call and 3 timed
    assert log[:4] == ["a", "a", "b", "b"]
    blocks = [log[4 + 4 * k][0] for k in range(8)]
    assert blocks == list("abbaabba") and all(len(set(log[4 + 4 * k : 8 + 4 * k])) == 1 for k in range(8))
    assert rows["a"]["repeats"] == rows["b"]["repeats"] == 12 and rows["a"]["interleaved"]["with"] == ["b"]
    assert 2 < rows["b"]["p50"] / rows["a"]["p50"] < 4.5  # 6 ms against 2 ms

    # a slow spell over the last 40% of the session: timed one after the other, b (timed second)
    # takes it all and looks 12x slower; interleaved, both take their share and the ratio holds
    log.clear()
    session.update(calls=0, spell_from=int(0.6 * 2 * 14))
    first, second = (measure(p.loaded(), 1, cpu, warmup=1, repeats=12) for p in (a, b))
    assert second["p50"] / first["p50"] > 8
    session.update(calls=0, spell_from=int(0.6 * 2 * 18))
    rows = measure_interleaved({"a": a.loaded(), "b": b.loaded()}, 1, cpu, warmup=1, repeats=12, rounds=4)
    assert 2 < rows["b"]["p50"] / rows["a"]["p50"] < 4.5
    with pytest.raises(EffvisionError, match="rounds <= repeats"):
        measure_interleaved({"a": a.loaded()}, 1, cpu, repeats=2, rounds=4)


def test_compare_times_files_side_by_side_on_one_backend(tmp_path, monkeypatch):
    import effvision.runtimes.onnx_files as runtime
    from effvision.deploy.bench import benchmark, compare

    spinning_seen, session = [], runtime.ort_session

    def recorded(path, threads=None, providers=None, spinning=True):
        s = session(path, threads, providers, spinning)
        try:
            spins = s.get_session_options().get_session_config_entry("session.intra_op.allow_spinning") != "0"
        except RuntimeError:  # not set: ONNX Runtime's default, spinning
            spins = True
        spinning_seen.append(spins)
        return s

    monkeypatch.setattr(runtime, "ort_session", recorded)
    path = export_onnx(nn.Sequential(nn.Flatten(), nn.Linear(12, 3)), tmp_path / "m.onnx", [3, 2, 2])
    benchmark(path, [3, 2, 2], "onnxruntime-cpu", "fp32", (1,), "cpu", warmup=1, repeats=3)
    assert spinning_seen == [True]  # alone: ONNX Runtime's default
    rows = compare(
        {"reference": (path, "fp32"), "final": (path, "fp32")},
        [3, 2, 2],
        "onnxruntime-cpu",
        (1, 2),
        "cpu",
        warmup=1,
        repeats=4,
        rounds=2,
    )
    assert [(r["target"], r["batch"]) for r in rows] == [("reference", 1), ("final", 1), ("reference", 2), ("final", 2)]
    assert all(r["backend"] == "onnxruntime-cpu" and r["p50"] > 0 and r["repeats"] == 4 for r in rows)
    # side by side: no session's threads spin between its runs, taking cores from the one being timed
    assert spinning_seen == [True, False, False]


def test_parity_is_judged_relative_to_the_logits_and_by_top1(trained):
    """One judgement for the export stage and the compatibility sweep: the exact file passes; a
    file 1e-3 off in relative terms, or one that swaps two classes' logits, fails and says why."""
    from effvision.deploy.verify import parity, parity_failure

    def predictor(change):
        return lambda x: change(trained.model(torch.from_numpy(x)).detach().numpy())

    exact = parity(trained.model, predictor(lambda y: y), trained.val)
    assert exact["relative_diff"] == 0 and parity_failure(exact, "fp32") is None
    scaled = parity(trained.model, predictor(lambda y: y * 1.001), trained.val)
    assert 5e-4 < scaled["relative_diff"] < 2e-3
    assert "relative" in parity_failure(scaled, "fp32") and parity_failure(scaled, "int8") is None
    swapped = parity(trained.model, predictor(lambda y: y[:, ::-1].copy()), trained.val)
    assert "top-1 agrees" in parity_failure(swapped, "int8")
