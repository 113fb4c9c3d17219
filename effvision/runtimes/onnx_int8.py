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
FOLDED = ("Relu", "Clip")  # activations ONNX Runtime's quantizer folds into the next QuantizeLinear


class CalibrationReader:
    """Feeds calibration samples to ONNX Runtime's calibrator one at a time: its histogram
    collectors (percentile, entropy) cannot stack outputs of unequal batches (a short last one).
    rewind() starts again from the first sample, so one reader serves every quantizer pass."""

    def __init__(self, loader, input_name: str):
        self.loader, self.name = loader, input_name
        self.rewind()

    def get_next(self):
        sample = next(self.samples, None)
        return None if sample is None else {self.name: sample}

    def rewind(self) -> None:
        self.samples = (x[i : i + 1].numpy() for x, *_ in self.loader for i in range(len(x)))


def cpu_has_vnni() -> bool:
    """x86 CPUs with VNNI (or AMX) multiply u8 x s8 without intermediate saturation."""
    from ..env import cpu_flags

    return bool(cpu_flags() & {"avx512_vnni", "avx_vnni", "amx_int8"})


def resolve_reduce_range(value: bool | str) -> bool:
    return (not cpu_has_vnni()) if value == "auto" else bool(value)


def _preprocess(src: Path, dst: Path, tmp: Path) -> None:
    from onnxruntime.quantization.shape_inference import quant_pre_process

    logging.getLogger("root").setLevel(logging.ERROR)
    src, dst = Path(src).resolve(), Path(dst).resolve()  # both named from the working directory it leaves
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
    _name_every_node(dst)


def _name_every_node(path: Path) -> None:
    """Nodes inlined from functions (HardSwish's HardSigmoid and Mul) come unnamed; a layer that
    may go back to float must be found by name."""
    import onnx

    model = onnx.load(str(path))
    taken = {n.name for n in model.graph.node}
    unnamed = [n for n in model.graph.node if not n.name]
    for i, node in enumerate(unnamed):
        node.name = f"{node.op_type}_{i}"
        while node.name in taken:
            node.name += "_"
        taken.add(node.name)
    if unnamed:
        onnx.save(model, str(path))


class Int8Builder:
    """One fp32 ONNX file prepared for int8 once (pre-processed, calibrated and quantized in
    `work`), then `write(dst, float_nodes)` for each variant that keeps some nodes float: trying
    many layer choices costs a graph edit each, not a calibration and a quantizer pass each."""

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

        from .onnx_files import ort_session

        if method not in CALIBRATION:
            raise EffvisionError(f"unknown calibration method '{method}' (choices: {', '.join(CALIBRATION)})")
        self.src, self.work = Path(src).resolve(), Path(work).resolve()
        self.method, self.per_channel = method, per_channel
        self.reduce_range = resolve_reduce_range(reduce_range)
        self.input_name = ort_session(self.src).get_inputs()[0].name
        self.work.mkdir(parents=True, exist_ok=True)
        self.pre = self.work / "pre.onnx"
        self.reader = CalibrationReader(calib_loader, self.input_name)
        self._int8 = self._pre = None  # the every-layer int8 model (made on the first write) and the float one
        _preprocess(self.src, self.pre, self.work)
        self.nodes = list(onnx.load(str(self.pre), load_external_data=False).graph.node)

    @property
    def layers(self) -> list[str]:
        """Names of the layers with weights, in graph order."""
        return [n.name for n in self.nodes if n.op_type in WEIGHTED_OPS]

    @property
    def quantized_nodes(self) -> list[str]:
        """Names of the nodes the int8 graph feeds dequantized tensors (layers, element-wise ops,
        pooling, activations), in graph order: what can go back to float."""
        self._base()
        dequantized = {t for n in self._int8.graph.node if n.op_type == "DequantizeLinear" for t in n.output}
        skip = ("QuantizeLinear", "DequantizeLinear")
        return [
            n.name for n in self._int8.graph.node if n.op_type not in skip and n.name and dequantized & set(n.input)
        ]

    def _base(self):
        import onnx

        if self._int8 is None:
            self._int8 = onnx.load(str(self._quantize(self.work / "int8-all.onnx")))
            self._pre = onnx.load(str(self.pre))
        return self._int8

    def write(self, dst: str | Path, float_nodes: Iterable[str] = ()) -> Path:
        """The int8 file with `float_nodes` (node names) computing in float: the every-layer int8
        graph is quantized once; each variant restores the named nodes' original inputs (float
        weights, float activations), which takes milliseconds where a quantizer pass takes seconds."""
        import onnx

        model = onnx.ModelProto()
        model.CopyFrom(self._base())
        restore_float(model, self._pre, set(float_nodes))
        return atomic_write(dst, lambda out: onnx.save(model, str(out)))

    def _quantize(self, dst: Path) -> Path:
        from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

        def write(out: Path) -> None:
            self.reader.rewind()  # a pass after the first reads the samples from the start again
            with contextlib.redirect_stdout(io.StringIO()):
                quantize_static(
                    str(self.pre),
                    str(out),
                    self.reader,
                    quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8,
                    per_channel=self.per_channel,
                    reduce_range=self.reduce_range,
                    calibrate_method=getattr(CalibrationMethod, CALIBRATION[self.method]),
                    extra_options={"CalibTensorRangeSymmetric": False},
                )

        return atomic_write(dst, write)


def restore_float(model, pre, names: set[str]) -> None:
    """Give the named nodes of a QDQ model the inputs they had before quantization (`pre`): float
    weights and biases instead of dequantized ones, float activations instead of quantize-
    dequantize pairs. Rewiring the inputs, not just skipping the node in the quantizer, is what
    keeps it float: ONNX Runtime's optimizer quantizes the weights of a float Conv or Gemm that
    sits between a DequantizeLinear and a QuantizeLinear (its WeightBiasQuantization pass)."""
    names = {n for n in names if n}  # an unnamed node cannot be told apart: it stays as quantized
    if not names:
        return
    import onnx

    graph, original = model.graph, {n.name: n for n in pre.graph.node if n.name}
    missing = sorted(names - set(original))  # a name in `pre` but not here was folded away: nothing to restore
    if missing:
        raise EffvisionError(f"no node named {', '.join(missing[:5])} in {pre.graph.name or 'the model'}")
    made_by = {t: n for n in graph.node for t in n.output}
    made_by_before = {t: n for n in pre.graph.node for t in n.output}
    floats = {i.name: i for i in pre.graph.initializer}
    present = {i.name for i in graph.initializer}
    available = present | set(made_by) | {i.name for i in graph.input} | {""}

    def weight(t: str) -> str:
        """t's float initializer, under a free name (a DequantizeLinear may output t itself)."""
        if t not in floats or t in present:
            return t
        name = t if t not in available else f"{t}_float"
        init = onnx.TensorProto()
        init.CopyFrom(floats[t])
        init.name = name
        graph.initializer.append(init)
        present.add(name)
        available.add(name)
        return name

    before: dict[str, list] = {}  # nodes to insert ahead of a node, keeping the graph in order
    for node in graph.node:
        if node.name not in names:
            continue
        inputs = list(original[node.name].input)
        lost = [t for t in inputs if t not in available and t not in floats]
        if lost:
            raise EffvisionError(f"cannot keep {node.name} in float: the quantizer removed its input {lost[0]}")
        for i, t in enumerate(inputs):
            act = made_by_before.get(t)
            if act is not None and act.op_type in FOLDED and made_by.get(t, act).op_type != act.op_type:
                # The quantizer folded this ReLU or Clip into a QuantizeLinear's range (t now holds
                # its input): a float reader needs it applied again.
                redo = onnx.NodeProto()
                redo.CopyFrom(act)
                redo.name, redo.output[0] = f"{act.name}_float", f"{t}_float"
                redo.input[:] = [t] + [weight(x) for x in act.input[1:]]
                if redo.output[0] not in available:
                    before.setdefault(node.name, []).append(redo)
                    available.add(redo.output[0])
                inputs[i] = redo.output[0]
            else:
                inputs[i] = weight(t)
        node.input[:] = inputs
    for out in graph.output:  # a float node's output leaves the graph unquantized too
        dq = made_by.get(out.name)
        q = made_by.get(dq.input[0]) if dq is not None and dq.op_type == "DequantizeLinear" else None
        source = made_by.get(q.input[0]) if q is not None and q.op_type == "QuantizeLinear" else None
        if source is not None and source.name in names:
            old = q.input[0]
            dq.output[0] = f"{out.name}_unused"  # the pair loses its reader and goes below
            for n in graph.node:
                n.input[:] = [out.name if t == old else t for t in n.input]
                n.output[:] = [out.name if t == old else t for t in n.output]
    ordered = [m for n in graph.node for m in [*before.get(n.name, []), n]]
    del graph.node[:]
    graph.node.extend(ordered)
    _drop_unused(graph)


def _drop_unused(graph) -> None:
    """Remove the quantize/dequantize nodes and initializers nothing reads any more."""
    while True:
        used = {t for n in graph.node for t in n.input} | {o.name for o in graph.output}
        dead = [
            n for n in graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear") and not set(n.output) & used
        ]
        if not dead:
            break
        for n in dead:
            graph.node.remove(n)
    unused = [i for i in graph.initializer if i.name not in used]
    for i in unused:
        graph.initializer.remove(i)


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
