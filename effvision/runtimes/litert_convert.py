"""Converts a torch.export program to a LiteRT (.tflite) file with litert-torch. Run as a script by
the LiteRT converter's own Python, never imported by effvision: litert-torch's dependencies pin
versions effvision's cannot share (xdsl pins typing-extensions < 4.13), so it lives in an
environment of its own (`make litert-converter`) and this file imports only torch, numpy and
the converter.

    python litert_convert.py PROGRAM.pt2 SAMPLES.npy OUT.tflite fp32|int8
    python litert_convert.py quantize FP32.tflite SAMPLES.npy OUT.tflite
    python litert_convert.py many JOBS.txt

SAMPLES.npy: input samples (N, C, H, W); the first is the example the program is traced with,
all of them calibrate int8. JOBS.txt: one "PROGRAM.pt2 SAMPLES.npy OUT.tflite" per line, each
converted in fp32 (a latency table's layers: the converter's start-up paid once).

int8 is the LiteRT tools' static int8 (ai-edge-quantizer's int8 weights and activations on the
fp32 file, calibrated on every sample): the file has int8 inputs and outputs with their scales.
Exit 1 with one line on stderr when the converter refuses the model."""

from __future__ import annotations

import sys


def convert(program: str, samples: str, out: str, precision: str) -> None:
    import litert_torch
    import numpy as np
    import torch

    inputs = np.load(samples)
    fp32 = out if precision == "fp32" else out + ".fp32.tflite"
    litert_torch.convert(torch.export.load(program).module(), (torch.from_numpy(inputs[:1]),)).export(fp32)
    if precision == "int8":
        quantize(fp32, inputs, out)


def quantize(fp32: str, inputs, out: str) -> None:
    """ai-edge-quantizer's static int8 (int8 weights and activations, min/max calibrated on every
    sample), on the fp32 file. (litert-torch's own PT2E path wrote files whose int8 logits agreed
    with PyTorch's top-1 on 3% of digits here, where this one agrees on 95%.)"""
    from ai_edge_litert.interpreter import Interpreter
    from ai_edge_quantizer import quantizer, recipe

    signatures = Interpreter(model_path=fp32).get_signature_list()
    name = next(iter(signatures))
    first_input = signatures[name]["inputs"][0]
    tool = quantizer.Quantizer(fp32)
    tool.load_quantization_recipe(recipe.static_wi8_ai8())
    calibration = tool.calibrate({name: [{first_input: x[None]} for x in inputs]}, num_threads=1)
    tool.quantize(calibration, enable_progress_report=False).export_model(out, overwrite=True)


def quantize_file(fp32: str, samples: str, out: str) -> None:
    import numpy as np

    quantize(fp32, np.load(samples), out)


def convert_many(jobs: str) -> None:
    with open(jobs) as f:
        for line in f:
            if line.strip():
                convert(*line.split(), "fp32")


def main(argv: list[str]) -> int:
    modes = {"quantize": (quantize_file, 3), "many": (convert_many, 1)}
    run, count = modes.get(argv[0], (convert, 4)) if argv else (convert, 4)
    args = argv[1:] if argv and argv[0] in modes else argv
    if len(args) != count or (run is convert and args[3] not in ("fp32", "int8")):
        print(__doc__.split("\n\n")[1].strip(), file=sys.stderr)
        return 2
    try:
        run(*args)
    except Exception as exc:  # noqa: BLE001  (the converter's refusal, said in one line by the caller)
        print(f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
