"""A latency model measured on the target: how fast a network runs at other channel widths.

Each convolution and linear layer is timed alone (one layer and its activation, in the target
runtime, at the target batch) on a grid of input and output widths: eighths of its own widths,
rounded to the channel multiple. A network's latency at new widths is predicted from the sum of
its layers' table times (bilinear between grid points), on a line fitted through measurements of
the whole network (LatencyModel). Tables are cached by layer, backend, batch and machine, so a second
search on the same architecture measures nothing again; a prediction is only a guide; every
answer the pipeline reports is a measurement of the whole network."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from timm.layers import Conv2dSame
from torch import nn

from .. import cache
from ..progress import log

LEVELS = 8  # grid points per width: k/8 of the full width, k = 1..8
TIMED_MS = 10  # timed per layer and pass: a 30-microsecond layer's median over 15 calls is noise
CONV = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
PAD = (nn.ConstantPad1d, nn.ConstantPad2d, nn.ConstantPad3d)


@dataclass(frozen=True)
class Layer:
    """A convolution or linear layer as the table sees it: its widths and everything else that
    sets its cost (kernel, stride, input size)."""

    name: str
    kind: str  # conv or linear
    cin: int
    cout: int
    groups: int
    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    spatial: tuple[int, ...]  # the input's size after (batch, channels); a linear layer's leading dims
    per_sample: int = 1  # rows of the layer's batch per input sample (a video net's frames)
    pad_end: tuple[int, ...] = ()  # padding after each spatial dimension where it differs from `padding`

    @property
    def depthwise(self) -> bool:
        return self.groups > 1 and self.groups == self.cin == self.cout

    def signature(self) -> str:
        """What makes two layers the same table (names and widths aside)."""
        return json.dumps(
            [
                self.kind,
                self.depthwise,
                self.groups if not self.depthwise else 0,
                self.kernel,
                self.stride,
                self.padding,
                self.dilation,
                self.spatial,
                self.per_sample,
                *([self.pad_end] if self.pad_end else []),  # the tables of symmetric layers keep their keys
            ]
        )

    def at(self, cin: int, cout: int) -> Layer:
        """The same layer at other widths (a depthwise conv keeps one width for both)."""
        if self.depthwise:
            cin = cout = min(cin, cout)
            return replace(self, cin=cin, cout=cout, groups=cin)
        return replace(self, cin=cin, cout=cout)


# The cost of one call with (almost) nothing to compute: every table time includes it, a network
# pays it once. A 1x1 linear layer stands for it, timed with the tables.
CALL = Layer("call", "linear", 1, 1, 1, (), (), (), (), (1,))


def find_layers(model: nn.Module, shape: list[int]) -> list[Layer]:
    """Every convolution and linear layer that runs on one input of `shape`, in call order."""
    found: list[Layer] = []
    hooks = []
    for name, m in model.named_modules():
        if isinstance(m, CONV + (nn.Linear,)):
            hooks.append(
                m.register_forward_hook(lambda mod, inp, out, name=name: found.append(_describe(name, mod, inp)))
            )
    try:
        with torch.inference_mode():
            model.eval()(torch.zeros(1, *shape))
    finally:
        for h in hooks:
            h.remove()
    seen, unique = set(), []
    for layer in found:  # a layer called twice (shared weights) is timed once per call shape
        if (layer.name, layer.spatial) not in seen:
            seen.add((layer.name, layer.spatial))
            unique.append(layer)
    return unique


def _describe(name: str, m: nn.Module, inputs) -> Layer:
    x = inputs[0]  # of a forward on one sample: its first dimension is the rows per sample
    if isinstance(m, nn.Linear):
        return Layer(name, "linear", m.in_features, m.out_features, 1, (), (), (), (), tuple(x.shape[1:-1]), x.shape[0])
    pad_end: tuple[int, ...] = ()
    if isinstance(m, Conv2dSame):
        pad, pad_end = _tf_same_padding(m, tuple(x.shape[2:]))
        pad_end = pad_end if pad_end != pad else ()
    elif isinstance(m.padding, tuple):
        pad = m.padding
    else:  # 'same' keeps the size (stride 1), 'valid' pads nothing
        same = m.padding == "same"
        pad = tuple(d * (k - 1) // 2 if same else 0 for k, d in zip(m.kernel_size, m.dilation, strict=True))
    return Layer(
        name,
        "conv",
        m.in_channels,
        m.out_channels,
        m.groups,
        tuple(m.kernel_size),
        tuple(m.stride),
        tuple(pad),
        tuple(m.dilation),
        tuple(x.shape[2:]),
        x.shape[0],
        pad_end,
    )


def _tf_same_padding(m: nn.Module, spatial: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Padding before and after each dimension that timm's Conv2dSame (the tf_ models' TensorFlow
    'SAME') adds in its forward from the input size: its `padding` attribute is 0, and a layer
    timed without it is another layer (a 5x5 kernel on a 4x4 map has no output)."""
    before, after = [], []
    for size, k, st, d in zip(spatial, m.kernel_size, m.stride, m.dilation, strict=True):
        total = max((-(-size // st) - 1) * st + (k - 1) * d + 1 - size, 0)
        before.append(total // 2)
        after.append(total - total // 2)
    return tuple(before), tuple(after)


def grid(width: int, multiple: int = 1) -> list[int]:
    """The widths a table measures: k/8 of `width`, rounded up to `multiple`, at most `width`."""
    levels = {min(width, max(multiple, -(-round(width * k / LEVELS) // multiple) * multiple)) for k in range(1, 9)}
    return sorted(levels)


# ----------------------------------------------------------------------------- one layer alone
def layer_module(layer: Layer) -> nn.Module:
    """The layer and a ReLU (the activation ONNX Runtime and torch fuse into it), random weights."""
    if layer.kind == "linear":
        core: nn.Module = nn.Linear(layer.cin, layer.cout)
    else:
        dims = len(layer.kernel)
        conv = CONV[dims - 1]
        asymmetric = bool(layer.pad_end)
        core = conv(
            layer.cin,
            layer.cout,
            layer.kernel,
            layer.stride,
            0 if asymmetric else layer.padding,
            layer.dilation,
            groups=layer.groups,
        )
        if asymmetric:  # F.pad's order: the last dimension first, (before, after) each
            sides = [p for b, a in zip(reversed(layer.padding), reversed(layer.pad_end), strict=True) for p in (b, a)]
            core = nn.Sequential(PAD[dims - 1](tuple(sides), 0.0), core)
    return nn.Sequential(core, nn.ReLU()).eval()


def layer_onnx(layer: Layer, path: Path) -> Path:
    """The same as an ONNX file with a dynamic batch, written with onnx.helper (exporting each
    grid point through torch.onnx would take seconds apiece)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    if layer.kind == "linear":
        w = rng.standard_normal((layer.cin, layer.cout), dtype=np.float32) * 0.1
        nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"]), helper.make_node("Add", ["mm", "b"], ["pre"])]
        x_shape = ["batch", *layer.spatial, layer.cin]
    else:
        w = rng.standard_normal((layer.cout, layer.cin // layer.groups, *layer.kernel), dtype=np.float32) * 0.1
        pads = list(layer.padding) + list(layer.pad_end or layer.padding)
        conv = helper.make_node(
            "Conv",
            ["x", "w", "b"],
            ["pre"],
            group=layer.groups,
            kernel_shape=list(layer.kernel),
            strides=list(layer.stride),
            pads=pads,
            dilations=list(layer.dilation),
        )
        nodes = [conv]
        x_shape = ["batch", layer.cin, *layer.spatial]
    nodes.append(helper.make_node("Relu", ["pre"], ["y"]))
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.zeros(layer.cout, np.float32), "b")]
    graph = helper.make_graph(
        nodes,
        "layer",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def _input_shape(layer: Layer) -> list[int]:
    return [*layer.spatial, layer.cin] if layer.kind == "linear" else [layer.cin, *layer.spatial]


# ----------------------------------------------------------------------------- tables
def layer_targets(layers: list[Layer], runtime, folder: Path) -> list:
    """What a backend of `runtime` times for each layer: the module, or its file in that runtime
    (written from the layer's ONNX file, or by the runtime's export from the module)."""
    if runtime.suffix is None:
        return [layer_module(layer) for layer in layers]
    folder.mkdir(parents=True, exist_ok=True)
    onnx = [layer_onnx(layer, folder / f"{i}.onnx") for i, layer in enumerate(layers)]
    items = [(layer_module(layer), list(_input_shape(layer)), path) for layer, path in zip(layers, onnx, strict=True)]
    return runtime.export_layers(items, folder)


def machine_key(backend: str, batch: int, device: torch.device) -> str:
    """Tables hold for one machine, the versions of torch and of what runs the backend, backend and batch."""
    from ..deploy.backends import BACKENDS
    from ..env import cpu_name

    what = [
        cpu_name(),
        os.cpu_count(),
        platform.machine(),
        torch.__version__,
        *BACKENDS.get(backend).versions(),
        backend,
        batch,
        str(device),
        torch.cuda.get_device_name(device) if device.type == "cuda" else None,
    ]
    return hashlib.sha256(json.dumps(what).encode()).hexdigest()[:16]


class LatencyTables:
    """Milliseconds per layer signature and (cin, cout), measured on one backend and batch,
    cached in `cache_dir` (a JSON file per machine key)."""

    def __init__(self, backend: str, batch: int, device: torch.device, cache_dir: str | Path = "runs/cache/latency"):
        self.backend, self.batch, self.device = backend, batch, device
        self.path = Path(cache_dir) / f"{machine_key(backend, batch, device)}.json"
        self.ms: dict[str, dict[str, float]] = cache.read_json(self.path, "latency-table")
        self.measured = 0  # grid points timed by this object (0 when the cache had them all)
        self._parsed: dict[str, dict[tuple[int, int], float]] = {}

    def ensure(self, layers: list[Layer], points: dict[str, list[tuple[int, int]]]) -> None:
        """Time every (layer, cin, cout) of `points` (by layer name) the cache lacks, side by side."""
        todo: dict[str, Layer] = {}
        for layer in [CALL, *layers]:
            for cin, cout in points.get(layer.name, [(1, 1)]):
                probe = layer.at(cin, cout)
                key = f"{probe.cin},{probe.cout}"
                if key not in self.ms.get(layer.signature(), {}):
                    todo[f"{layer.signature()}|{key}"] = probe
        if not todo:
            return
        log(f"  latency tables: timing {len(todo)} layer widths on {self.backend} at batch {self.batch}")
        timed = self._time(todo)

        def merge(tables: dict) -> dict:  # with what other runs sharing the cache added meanwhile
            for sig_key, ms in timed.items():
                sig, key = sig_key.split("|")
                tables.setdefault(sig, {}).setdefault(key, ms)
            return tables

        self.ms = cache.update(self.path, merge, "latency-table")
        self._parsed.clear()
        self.measured += len(todo)

    def _time(self, todo: dict[str, Layer]) -> dict[str, float]:
        """Each layer timed alone with warm-up (a layer's weights warm in the cache, as when the
        network runs), the sweep three times in alternating orders, keeping each layer's fastest
        median (a slow spell of a shared machine then costs a point only if it hits every pass). Timed
        in tight alternation with 60 other sessions instead, a 128-channel conv measured 2.6x
        its own time alone."""
        from ..deploy.backends import BenchOptions, backend
        from ..deploy.bench import measure

        inst = backend(self.backend)
        opts = BenchOptions(device=self.device, side_by_side=True)
        best: dict[str, float] = {}
        items = list(todo.items())
        with tempfile.TemporaryDirectory() as tmp:
            for start in range(0, len(items), 64):  # a few dozen sessions open at a time
                chunk = items[start : start + 64]
                targets = layer_targets([layer for _, layer in chunk], inst.runtime, Path(tmp) / str(start))
                loaded = {
                    key: inst.load(target, _input_shape(layer), opts)
                    for (key, layer), target in zip(chunk, targets, strict=True)
                }
                for order in (chunk, chunk[::-1], chunk):
                    for key, layer in order:
                        rows = self.batch * layer.per_sample
                        # the first pass estimates; later ones time each layer for about TIMED_MS
                        repeats = 15 if key not in best else int(np.clip(TIMED_MS / best[key], 15, 400))
                        p50 = measure(loaded[key], rows, self.device, warmup=5, repeats=repeats)["p50"]
                        best[key] = min(best.get(key, p50), p50)
        return best

    def call_ms(self) -> float:
        """The per-call cost every table time includes (timed by ensure)."""
        return self.ms[CALL.signature()]["1,1"]

    def _points(self, signature: str) -> dict[tuple[int, int], float]:
        if signature not in self._parsed:
            self._parsed[signature] = {tuple(map(int, k.split(","))): v for k, v in self.ms[signature].items()}
        return self._parsed[signature]

    def lookup(self, layer: Layer, cin: float, cout: float) -> float:
        """Milliseconds at (cin, cout), bilinear between the measured grid points around it. Layers
        that share a table may have measured different grids (a classifier's fixed outputs beside
        another layer's), so the input width is interpolated along each output width measured."""
        pts = self._points(layer.signature())
        if layer.depthwise:
            xs = sorted({a for a, _ in pts})
            return float(np.interp(min(cin, cout), xs, [pts[(a, a)] for a in xs]))

        def along(out: int) -> float:
            ins = sorted(a for a, b in pts if b == out)
            return float(np.interp(cin, ins, [pts[(a, out)] for a in ins]))

        outs = sorted({b for _, b in pts})
        o0, o1 = _bracket(outs, float(np.clip(cout, outs[0], outs[-1])))
        fo = 0.0 if o1 == o0 else (cout - o0) / (o1 - o0)
        return (1 - fo) * along(o0) + fo * along(o1)


def _bracket(values: list[int], v: float) -> tuple[int, int]:
    hi = next((x for x in values if x >= v), values[-1])
    lo = next((x for x in reversed(values) if x <= v), values[0])
    return lo, hi


class LatencyModel:
    """A network's latency at other layer widths, from its layers' tables: measured latency is
    fitted as a + s * (sum of the layers' table times, each less the per-call cost), a line
    through the network's measurements (full width, near half and a quarter width, each step's). A
    layer timed alone runs 1.4-2x slower than inside its network (ONNX Runtime, 2-core x86: a
    32-channel 3x3 conv at 32x32, 0.23-0.29 ms alone against 0.14 ms in the network, by its
    profiler), and the rest of the network (element-wise ops, pooling, the per-call cost) does not
    shrink with the tables: the line absorbs both."""

    def __init__(self, layers: list[Layer], tables: LatencyTables):
        self.layers, self.tables = layers, tables
        self.measurements: list[tuple[dict[str, tuple[float, float]], float]] = []  # (widths, measured ms)
        self._line: tuple[float, float] | None = None  # fitted once per set of measurements
        # A width search predicts the same few widths per layer hundreds of thousands of times (every
        # grid vector of a 50-layer net): each lookup is computed once (the tables are complete here).
        self._layer_ms: dict[tuple[str, tuple[int, ...], float, float], float] = {}

    def layer_ms(self, layer: Layer, cin: float, cout: float) -> float:
        """The layer's table time at (cin, cout) less the per-call cost it was timed with (a
        network of 20 layers pays that once, not 20 times)."""
        key = (layer.name, layer.spatial, cin, cout)
        ms = self._layer_ms.get(key)
        if ms is None:
            ms = self._layer_ms[key] = max(0.0, self.tables.lookup(layer, cin, cout) - self.tables.call_ms())
        return ms

    def table_sum(self, widths: dict[str, tuple[float, float]]) -> float:
        """widths: layer name -> (cin, cout) for the layers not at their full width."""
        return sum(self.layer_ms(layer, *widths.get(layer.name, (layer.cin, layer.cout))) for layer in self.layers)

    def add_measurement(self, widths: dict[str, tuple[float, float]], ms: float) -> None:
        self.measurements.append((dict(widths), ms))
        self._line = None

    def line(self) -> tuple[float, float]:
        """(a, s): the intercept and slope; with one measurement, s = 1 (savings taken as tabled)."""
        if self._line is None:
            self._line = self._fit()
        return self._line

    def _fit(self) -> tuple[float, float]:
        sums = np.array([self.table_sum(w) for w, _ in self.measurements])
        ms = np.array([m for _, m in self.measurements])
        if len(ms) == 1 or np.ptp(sums) < 1e-9:
            return float(ms.mean() - sums.mean()), 1.0
        s, a = np.polyfit(sums, ms, 1)
        if a < 0:  # through the origin instead: a negative intercept predicts a narrow net at ~0 ms
            a, s = 0.0, float(np.dot(sums, ms) / np.dot(sums, sums))
        return float(a), float(max(s, 1e-6))

    def predict(self, widths: dict[str, tuple[float, float]]) -> float:
        a, s = self.line()
        return a + s * self.table_sum(widths)


def build_latency_model(
    model: nn.Module,
    shape: list[int],
    tables: LatencyTables,
    multiple: int = 1,
    fixed_in: set[str] = frozenset(),
    fixed_out: set[str] = frozenset(),
) -> LatencyModel:
    """Measure (or read from the cache) the tables of every layer of `model` on its width grid;
    widths named fixed (the network's input channels, the classifier's outputs) are not varied.
    Add whole-network measurements (add_measurement) before predicting."""
    layers = find_layers(model, shape)
    points = {}
    for layer in layers:
        step = multiple * (layer.groups if layer.groups > 1 and not layer.depthwise else 1)
        ins = [layer.cin] if layer.name in fixed_in or layer.depthwise else grid(layer.cin, step)
        outs = [layer.cout] if layer.name in fixed_out else grid(layer.cout, step)
        points[layer.name] = [(c, c) for c in outs] if layer.depthwise else [(a, b) for a in ins for b in outs]
    tables.ensure(layers, points)
    return LatencyModel(layers, tables)
