"""The device's physical limits: the peak (FLOP/s) a model run in a precision cannot exceed, and
the copy bandwidth (bytes read + written per second) measured in the same run as the benchmark.

A model's achieved FLOP/s divided by the peak says how much of the hardware it uses; the peak
divided by the bandwidth is the arithmetic intensity below which work is memory-bound.

On a CPU whose instruction set and clock can be read, the peak is the theoretical one
(cpu_ceiling.py): a share above 100% is then impossible by construction. A measured matrix
product is not a ceiling (convolution kernels beat it), so probes are the fallback only where the
peak cannot be computed (a GPU, a CPU that is not x86): the best of torch's matrix product and
ONNX Runtime's, at two sizes, with every thread, the fastest of several calls, run again where a
model beat them; a row that still beats a probe gets no share, and one line says so."""

from __future__ import annotations

import torch

from ..device import Timer, synchronize
from . import cpu_ceiling

# Matrix sizes: large enough to leave launch and cache effects behind, small enough to stay quick
# on a 2-core CPU (a 2048^3 fp32 product is ~17 GFLOP, about 0.1 s there).
_MATMUL_N = {"cpu": 2048, "cuda": 8192}
_COPY_BYTES = {"cpu": 256 << 20, "cuda": 2 << 30}
_DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _best_ms(fn, device, warmup: int, repeats: int) -> float:
    """The fastest of `repeats` timed calls: a ceiling is what the device can do, so the run
    least disturbed by other work on a shared machine is the right estimate."""
    timer = Timer(device)
    for _ in range(warmup):
        fn()
    synchronize(device)
    return min(timer.time(fn) for _ in range(repeats))


def _product(device: torch.device, precision: str, n: int):
    """A zero-argument n x n x n matrix product in `precision`, or None where there is none."""
    if precision in _DTYPES:
        a = torch.randn(n, n, device=device, dtype=_DTYPES[precision])
        b = torch.randn(n, n, device=device, dtype=_DTYPES[precision])
        return lambda: torch.mm(a, b)
    if precision == "int8":
        a = torch.randint(-128, 127, (n, n), device=device, dtype=torch.int8)
        b = torch.randint(-128, 127, (n, n), device=device, dtype=torch.int8)
        return lambda: torch._int_mm(a, b)
    if precision == "float8" and device.type == "cuda":
        a = torch.randn(n, n, device=device).to(torch.float8_e4m3fn)
        b = torch.randn(n, n, device=device).to(torch.float8_e4m3fn).t()
        one = torch.ones((), device=device)
        return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    return None


def _ort_product(precision: str, n: int):
    """A zero-argument n x n x n matrix product in ONNX Runtime on the CPU (every thread), or None
    where it has none for `precision`: MatMul for fp32, MatMulInteger (uint8 x int8, int32 out)
    for int8, as the QDQ files run them."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    if precision == "fp32":
        a = rng.standard_normal((n, n), dtype=np.float32)
        b, a_type, op, out_type = a.T.copy(), TensorProto.FLOAT, "MatMul", TensorProto.FLOAT
    elif precision == "int8":
        a = rng.integers(0, 255, (n, n), dtype=np.uint8)
        b = rng.integers(-127, 127, (n, n), dtype=np.int8)
        a_type, op, out_type = TensorProto.UINT8, "MatMulInteger", TensorProto.INT32
    else:
        return None
    graph = helper.make_graph(
        [helper.make_node(op, ["a", "b"], ["c"])],
        "probe",
        [helper.make_tensor_value_info("a", a_type, [n, n])],
        [helper.make_tensor_value_info("c", out_type, [n, n])],
        [numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return lambda: session.run(None, {"a": a})


def _fitting_size(device: torch.device, precision: str, n_max: int, seconds: float = 0.3) -> int:
    """The largest power-of-two size up to n_max whose product takes about `seconds` or less:
    a CPU without bf16/fp16/int8 matrix units runs those products 100x slower than fp32, and a
    2048^3 one would then take half a minute."""
    if device.type != "cpu":
        return n_max
    fn = _product(device, precision, 256)
    fn()
    rate = 2 * 256**3 / max(_best_ms(fn, device, warmup=0, repeats=2) / 1e3, 1e-9)
    n = n_max
    while n > 256 and 2 * n**3 / rate > seconds:
        n //= 2
    return n


def matmul_peak(
    device: torch.device | str, precision: str = "fp32", n: int | None = None, repeats: int = 5
) -> dict | None:
    """FLOP/s of an n x n x n matrix product in `precision` on `device`; None where the device has
    no such product (e.g. float8 before Hopper/Ada, int8 without torch._int_mm)."""
    device = torch.device(device)
    tf32 = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
        if _product(device, precision, 16) is None:
            return None
        n = n or _fitting_size(device, precision, _MATMUL_N[device.type])
        fn = _product(device, precision, n)
        ms = _best_ms(fn, device, warmup=2, repeats=repeats)
    except (RuntimeError, NotImplementedError):
        return None
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    return {"precision": precision, "n": n, "ms": round(ms, 4), "flops_per_s": 2 * n**3 / (ms / 1e3), "probe": "torch"}


def ort_matmul_peak(precision: str, sizes: tuple[int, ...] = (1024, 2048), repeats: int = 7) -> dict | None:
    """FLOP/s of ONNX Runtime's own matrix product on the CPU, the best over `sizes`; None where
    ONNX Runtime has no product in `precision` here."""
    best = None
    for n in sizes:
        try:
            fn = _ort_product(precision, n)
            if fn is None:
                return None
            ms = _best_ms(fn, torch.device("cpu"), warmup=2, repeats=repeats)
        except Exception:  # noqa: BLE001  (an unavailable kernel leaves the torch probe alone)
            continue
        row = {"precision": precision, "n": n, "ms": round(ms, 4), "flops_per_s": 2 * n**3 / (ms / 1e3)}
        if best is None or row["flops_per_s"] > best["flops_per_s"]:
            best = {**row, "probe": "onnxruntime"}
    return best


def copy_bandwidth(device: torch.device | str, nbytes: int | None = None, repeats: int = 5) -> dict:
    """Bytes per second of a device-to-device copy, counting the bytes read and written."""
    device = torch.device(device)
    nbytes = nbytes or _COPY_BYTES[device.type]
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    ms = _best_ms(lambda: dst.copy_(src), device, warmup=2, repeats=repeats)
    return {"bytes": 2 * nbytes, "ms": round(ms, 4), "bytes_per_s": 2 * nbytes / (ms / 1e3)}


class Roofline:
    """Peaks found once per (device, precision) and kept for the run: the CPU's theoretical peak
    where it can be computed, else the probes'."""

    def __init__(self, device: torch.device | str, theoretical: bool = True):
        self.device = torch.device(device)
        self.theoretical = theoretical and self.device.type == "cpu"
        self.peaks: dict[str, dict | None] = {}
        self.bandwidth: dict | None = None

    def peak(self, precision: str, at_least: float = 0.0, retries: int = 2) -> dict | None:
        """The ceiling for a model run in `precision`. Computed, it is the CPU's theoretical peak
        (that precision's instructions or fp32's, the faster). Probed, it is the fastest of that
        precision's matrix products and the fp32 ones (a CPU without bf16/int8 matrix units runs
        those slower than fp32, and a runtime may compute in fp32 anyway); where a model achieved
        `at_least` FLOP/s and the probes are lower, they run again up to `retries` times, the best
        kept: on a shared machine a probe may have met a busy moment that the model did not."""
        if self.theoretical:
            if precision not in self.peaks:
                self.peaks[precision] = cpu_ceiling.ceiling(precision)
            if self.peaks[precision] is not None:
                return self.peaks[precision]
            self.theoretical = False  # instruction set or clock unreadable: probe instead
            self.peaks.clear()
        for p in {precision, "fp32"}:
            if p not in self.peaks:
                self.peaks[p] = self._probe(p)
        for _ in range(retries):
            best = self._best(precision)
            if best is None or best["flops_per_s"] >= at_least:
                break
            for p in {precision, "fp32"}:
                again = self._probe(p)
                if again and (self.peaks[p] is None or again["flops_per_s"] > self.peaks[p]["flops_per_s"]):
                    self.peaks[p] = again
        return self._best(precision)

    def _best(self, precision: str) -> dict | None:
        candidates = [v for v in (self.peaks[precision], self.peaks["fp32"]) if v]
        return max(candidates, key=lambda v: v["flops_per_s"], default=None)

    def _probe(self, precision: str) -> dict | None:
        probes = [matmul_peak(self.device, precision)]
        if self.device.type == "cpu":
            probes.append(ort_matmul_peak(precision))
        return max((p for p in probes if p), key=lambda v: v["flops_per_s"], default=None)

    def measure_bandwidth(self) -> dict:
        if self.bandwidth is None:
            self.bandwidth = copy_bandwidth(self.device)
        return self.bandwidth

    def summary(self) -> dict:
        bw = self.measure_bandwidth()
        return {
            "device": str(self.device),
            "copy_bytes_per_s": bw["bytes_per_s"],
            "matmul_flops_per_s": {p: (v["flops_per_s"] if v else None) for p, v in self.peaks.items()},
            "matmul_probe": {p: (v["probe"] if v else None) for p, v in self.peaks.items()},
            "peak_how": {
                p: v.get("how") or f"{v['probe']} matrix product, n={v.get('n')}" for p, v in self.peaks.items() if v
            },
        }
