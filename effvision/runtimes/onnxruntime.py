"""ONNX Runtime: .onnx files (one file, dynamic batch), int8 as QDQ by its quantize_static with any
named nodes kept in float (onnx_int8.py), metadata in the model's metadata_props."""

from __future__ import annotations

import tempfile
from pathlib import Path

from ..registry import RUNTIMES
from .base import Runtime, RuntimeUnavailable, Session, Target

PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}


@RUNTIMES.register("onnxruntime")
class OnnxRuntime(Runtime):
    kind, suffix, format, describes, label = "onnx", ".onnx", "onnx", "an ONNX file", "ONNX"
    targets = (
        Target("onnxruntime-cpu", {"cpu": ("fp32", "fp16", "int8")}),  # int8: QDQ U8S8 kernels
        # inputs copied from the host on every call, as an application feeding numpy would
        Target("onnxruntime-cuda", {"cuda": ("fp32", "fp16", "int8")}),
    )
    precisions = ("fp32", "fp16", "int8")
    packages = ("onnxruntime",)
    int8_tool = "ONNX Runtime's quantize_static (QDQ U8S8), effvision's node search"
    keeps_float = True
    bundle_package = "onnxruntime"
    keeps_metadata_inside = True  # the model's metadata_props

    def missing(self, purpose="run", device="cpu"):
        import onnxruntime as ort

        provider = PROVIDERS.get(device)
        if purpose == "run" and provider not in ort.get_available_providers():
            return f"onnxruntime has no {provider} here (providers: {', '.join(ort.get_available_providers())})"
        return None

    def export(self, model, path, shape, precision="fp32", calibration=(), batch=1):
        from .onnx_files import export_onnx, onnx_to_fp16

        self.check_precision(precision)
        if precision == "fp32":
            return export_onnx(model, path, shape)
        with tempfile.TemporaryDirectory() as tmp:
            fp32 = export_onnx(model, Path(tmp) / "fp32.onnx", shape)
            return onnx_to_fp16(fp32, path) if precision == "fp16" else self.quantize(fp32, Path(path), calibration)

    def quantize(self, src, dst, calibration, keep_float=(), **options):
        """keep_float: node names; those the file lacks are passed over (the same model exported at
        another input size has the same node names, and a lever's float nodes carry over so)."""
        with tempfile.TemporaryDirectory() as tmp:
            variants = self.int8_variants(src, calibration, Path(tmp), **options)
            return variants.write(dst, set(keep_float) & {n.name for n in variants.nodes})

    def int8_variants(self, src, calibration, work, **options):
        from .onnx_int8 import Int8Builder

        return Int8Builder(src, calibration, work, **options)

    def export_layers(self, layers, folder):
        return [onnx for _, _, onnx in layers]  # the table's layers are ONNX files already

    def open(self, path, device="cpu", threads=None, spinning=True):
        from .onnx_files import ort_session, run_session

        provider = PROVIDERS[device]
        providers = [provider] + (["CPUExecutionProvider"] if device != "cpu" else [])
        session = ort_session(path, threads=threads, providers=providers, spinning=spinning)
        if session.get_providers()[0] != provider:  # ORT falls back to the CPU with only a warning
            raise RuntimeUnavailable(
                f"onnxruntime did not start {provider} (session runs on {', '.join(session.get_providers())})"
            )
        return Session(lambda x: run_session(session, x), {"providers": session.get_providers()})

    def input_shape(self, path):
        from .onnx_files import onnx_input_shape

        return [0, *onnx_input_shape(path)]

    def precision(self, path, said=None):
        from .onnx_files import onnx_precision

        return onnx_precision(path)

    def read_metadata(self, path, key):
        from .onnx_files import load_onnx

        return next((p.value for p in load_onnx(path, external=False).metadata_props if p.key == key), None)

    def write_metadata(self, path, key, text):
        import onnx

        from ..fileio import atomic_write

        model = onnx.load(str(path))
        kept = [p for p in model.metadata_props if p.key != key]
        del model.metadata_props[:]
        model.metadata_props.extend(kept)
        entry = model.metadata_props.add()
        entry.key, entry.value = key, text
        atomic_write(Path(path), lambda tmp: onnx.save(model, str(tmp)))
        return True
