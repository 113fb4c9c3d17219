"""Post-training static int8 quantization with ONNX Runtime: QDQ, uint8 activations, int8
per-channel weights (U8S8, the fast path on x86 CPUs), after quant_pre_process."""

from __future__ import annotations

import contextlib
import io
import logging
import tempfile
from pathlib import Path

from ..errors import EffvisionError
from ..fileio import atomic_write

CALIBRATION = {"minmax": "MinMax", "percentile": "Percentile", "entropy": "Entropy"}


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
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    from ..deploy.runtime import ort_session

    if method not in CALIBRATION:
        raise EffvisionError(f"unknown calibration method '{method}' (choices: {', '.join(CALIBRATION)})")
    reduce_range = resolve_reduce_range(reduce_range)
    input_name = ort_session(src).get_inputs()[0].name
    with tempfile.TemporaryDirectory() as tmp:
        pre = Path(tmp) / "pre.onnx"
        logging.getLogger("root").setLevel(logging.ERROR)
        src = Path(src).resolve()
        # chdir: a failed symbolic inference leaves sym_shape_infer_temp.onnx and its tensors in
        # the working directory; keep them in the temporary one.
        with contextlib.redirect_stdout(io.StringIO()), contextlib.chdir(tmp):
            try:
                quant_pre_process(str(src), str(pre), skip_symbolic_shape=False)
            except Exception:  # noqa: BLE001  (ORT raises bare Exceptions and TypeErrors here)
                # Symbolic inference is best effort: it gives up (or crashes) on shapes computed at
                # run time (TSM's shift masks, a point network's TopK groups); ONNX's own shape
                # inference is enough for the quantizer then.
                quant_pre_process(str(src), str(pre), skip_symbolic_shape=True)

        def write(out: Path) -> None:
            with contextlib.redirect_stdout(io.StringIO()):
                quantize_static(
                    str(pre),
                    str(out),
                    _Reader(calib_loader, input_name),
                    quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8,
                    per_channel=per_channel,
                    reduce_range=reduce_range,
                    calibrate_method=getattr(CalibrationMethod, CALIBRATION[method]),
                    nodes_to_exclude=exclude or [],
                    extra_options={"CalibTensorRangeSymmetric": False},
                )

        return atomic_write(dst, write)
