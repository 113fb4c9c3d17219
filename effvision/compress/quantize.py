"""Post-training static int8 quantization with ONNX Runtime: QDQ, uint8 activations, int8
per-channel weights (U8S8, the fast path on x86 CPUs), after quant_pre_process. An Int8Builder
calibrates once and then writes variants of one file that keep different layers in float."""

from __future__ import annotations

import contextlib
import io
import logging
import tempfile
from pathlib import Path
from typing import Iterable

from ..errors import EffvisionError
from ..fileio import atomic_write

CALIBRATION = {"minmax": "MinMax", "percentile": "Percentile", "entropy": "Entropy"}
# Layers with weights: what accuracy-aware quantization ranks and may revert to float.
WEIGHTED_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")


class _Reader:
    """Feeds calibration samples to ONNX Runtime's calibrator one at a time: its histogram
    collectors (percentile, entropy) cannot stack outputs of unequal batches (a short last one)."""

    def __init__(self, loader, input_name: str):
        self.samples = (x[i : i + 1].numpy() for x, *_ in loader for i in range(len(x)))
        self.name = input_name

    def get_next(self):
        sample = next(self.samples, None)
        return None if sample is None else {self.name: sample}

    def rewind(self):  # required by newer CalibrationDataReader users
        pass


def cpu_has_vnni() -> bool:
    """x86 CPUs with VNNI (or AMX) multiply u8 x s8 without intermediate saturation."""
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        return False
    return any(f in flags for f in ("avx512_vnni", "avx_vnni", "amx_int8"))


def resolve_reduce_range(value: bool | str) -> bool:
    return (not cpu_has_vnni()) if value == "auto" else bool(value)


def _preprocess(src: Path, dst: Path, tmp: Path) -> None:
    from onnxruntime.quantization.shape_inference import quant_pre_process

    logging.getLogger("root").setLevel(logging.ERROR)
    # chdir: a failed symbolic inference leaves sym_shape_infer_temp.onnx and its tensors in
    # the working directory; keep them in the temporary one.
    with contextlib.redirect_stdout(io.StringIO()), contextlib.chdir(tmp):
        try:
            quant_pre_process(str(src), str(dst), skip_symbolic_shape=False)
        except Exception:  # noqa: BLE001  (ORT raises bare Exceptions and TypeErrors here)
            # Symbolic inference is best effort: it gives up (or crashes) on shapes computed at
            # run time (TSM's shift masks, a point network's TopK groups); ONNX's own shape
            # inference is enough for the quantizer then.
            quant_pre_process(str(src), str(dst), skip_symbolic_shape=True)


class Int8Builder:
    """One fp32 ONNX file prepared for int8 once (pre-processing, calibration cached in `work`),
    then `write(dst, float_nodes)` for each variant: the calibration runs on the first write only,
    so trying many layer choices costs a quantizer pass each, not a calibration each."""

    def __init__(
        self,
        src: str | Path,
        calib_loader,
        work: str | Path,
        method: str = "percentile",
        per_channel: bool = True,
        reduce_range: bool | str = "auto",
    ):
        import onnx

        from ..deploy.runtime import ort_session

        if method not in CALIBRATION:
            raise EffvisionError(f"unknown calibration method '{method}' (choices: {', '.join(CALIBRATION)})")
        self.src, self.work = Path(src).resolve(), Path(work)
        self.method, self.per_channel = method, per_channel
        self.reduce_range = resolve_reduce_range(reduce_range)
        self.input_name = ort_session(self.src).get_inputs()[0].name
        self.work.mkdir(parents=True, exist_ok=True)
        self.pre = self.work / "pre.onnx"
        self.cache = self.work / "calibration.json"
        self._loader = calib_loader
        _preprocess(self.src, self.pre, self.work)
        self.nodes = list(onnx.load(str(self.pre), load_external_data=False).graph.node)

    @property
    def layers(self) -> list[str]:
        """Names of the layers with weights, in graph order."""
        return [n.name for n in self.nodes if n.op_type in WEIGHTED_OPS]

    def write(self, dst: str | Path, float_nodes: Iterable[str] = ()) -> Path:
        """The int8 file with `float_nodes` (node names) left in float."""
        from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

        reader = None if self.cache.is_file() else _Reader(self._loader, self.input_name)

        def write(out: Path) -> None:
            with contextlib.redirect_stdout(io.StringIO()):
                quantize_static(
                    str(self.pre),
                    str(out),
                    reader,
                    quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8,
                    per_channel=self.per_channel,
                    reduce_range=self.reduce_range,
                    calibrate_method=getattr(CalibrationMethod, CALIBRATION[self.method]),
                    nodes_to_exclude=sorted(float_nodes),
                    # A float node's input must not rely on a quantizer that dropped a Relu
                    # into the range of a QuantizeLinear (keep_float bypasses that pair).
                    extra_options={
                        "CalibTensorRangeSymmetric": False,
                        "QDQKeepRemovableActivations": bool(float_nodes),
                    },
                    calibration_cache_path=str(self.cache),
                )

        path = atomic_write(dst, write)
        if float_nodes:
            keep_float(path, set(float_nodes))
        return path


def keep_float(path: Path, names: set[str]) -> None:
    """Feed the named nodes float activations instead of dequantized ones. ONNX Runtime's graph
    optimizer quantizes the weights of a float Conv or Gemm that sits between a DequantizeLinear
    and a QuantizeLinear (its WeightBiasQuantization pass), so excluding a node from the quantizer
    is not enough to keep it float in the session that runs the file."""
    import onnx

    model = onnx.load(str(path))
    graph = model.graph
    producer = {o: n for n in graph.node for o in n.output}
    for node in graph.node:
        if node.name not in names:
            continue
        for i, tensor in enumerate(node.input):
            dq = producer.get(tensor)
            q = producer.get(dq.input[0]) if dq is not None and dq.op_type == "DequantizeLinear" else None
            if q is not None and q.op_type == "QuantizeLinear":
                node.input[i] = q.input[0]
    used = {t for n in graph.node for t in n.input} | {o.name for o in graph.output}
    while True:  # drop the quantize/dequantize pairs nothing reads any more
        dead = [
            n for n in graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear") and not set(n.output) & used
        ]
        if not dead:
            break
        for n in dead:
            graph.node.remove(n)
        used = {t for n in graph.node for t in n.input} | {o.name for o in graph.output}
    onnx.save(model, str(path))


def quantize_onnx(
    src: str | Path,
    dst: str | Path,
    calib_loader,
    method: str = "percentile",
    per_channel: bool = True,
    exclude: list[str] | None = None,
    reduce_range: bool | str = "auto",
) -> Path:
    """Without VNNI, ONNX Runtime's U8S8 kernels can saturate 16-bit intermediate sums; 7-bit
    weights (reduce_range) avoid it (ONNX Runtime's quantization guide). `auto` decides by CPU.
    Percentile calibration (the default) clips rare activation outliers; on the CIFAR-10
    ResNet-18 of BENCHMARKS.md it agreed with fp32 more often than min/max ranges."""
    with tempfile.TemporaryDirectory() as tmp:
        builder = Int8Builder(src, calib_loader, tmp, method, per_channel, reduce_range)
        return builder.write(dst, exclude or [])
