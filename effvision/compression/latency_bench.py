"""How far the latency model's prediction is from measurement (`make bench-latency`).

For each architecture (random weights: latency does not depend on them), the latency model is
built as the target-aware prune stage builds it (target_prune.measured_latency_model: channel
multiple measured, tables, a line through the full network and copies near half and a quarter of
its widths), then candidates are measured against the full network
on the target backend, interleaved: the plans for 80%, 60% and 45% of its latency, and uniform
30% and 50% prunes at the same multiple. Each row gives the prediction, the measurement (on the
scale of the first reference timing) and the error.

    python -m effvision.compression.latency_bench cifar_resnet20 speednet timm:mobilenetv3_small_050
"""

from __future__ import annotations

import argparse
import copy
import time
from pathlib import Path

import torch

from ..env import cpu_name
from ..fileio import write_json
from ..models import create_model
from ..recipe import TargetConfig
from .aim import Aim
from .latency_prune import channel_groups, layer_widths, plan_widths, ratios_for
from .prune import prune
from .stages import PruneConfig
from .target_prune import measured_latency_model

PLANS = (0.8, 0.6, 0.45)  # of the full network's latency
UNIFORM = (0.3, 0.5)  # ratios of a uniform prune


def candidates(model, lat, original, multiple: int, full_ms: float) -> dict:
    out = {}
    for share in PLANS:
        m = copy.deepcopy(model)
        groups = channel_groups(m)
        plan = plan_widths(groups, original, layer_widths(m), lat, share * full_ms, multiple)
        out[f"plan {share:.0%}"] = prune(m, 0.0, layer_ratios=ratios_for(plan.widths, groups))
    for ratio in UNIFORM:
        out[f"uniform {ratio:.0%}"] = prune(copy.deepcopy(model), ratio, round_to=multiple)
    return out


def probe(name: str, shape: list[int], target: TargetConfig, cfg: PruneConfig, repeats: int) -> dict:
    torch.manual_seed(0)
    t0 = time.perf_counter()
    model = create_model(name, num_classes=10, input_size=shape).eval()
    aim = Aim(target, model, shape, torch.device("cpu"), warmup=10, repeats=repeats)
    try:
        first = aim.measure(model)
        record: dict = {}
        lat, groups, original, multiple = measured_latency_model(model, shape, aim, first, cfg, record)
        cands = candidates(model, lat, original, multiple, first["scaled_ms"])
        ms = aim.timings(cands)
        rows = []
        for label, m in cands.items():
            measured = aim.scaled(ms[label], ms["reference"])
            predicted = lat.predict(layer_widths(m))
            rows.append(
                {
                    "candidate": label,
                    "predicted_ms": round(predicted, 4),
                    "measured_ms": round(measured, 4),
                    "error": round((predicted - measured) / measured, 3),
                }
            )
    finally:
        aim.close()
    return {
        "model": name,
        "full_ms": first["scaled_ms"],
        "channel_multiple": record["channel_multiple"],
        "latency_model": record["latency_model"],
        "candidates": rows,
        "seconds": round(time.perf_counter() - t0, 1),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+", help="zoo names or timm:NAME")
    ap.add_argument("--input-size", default="3,32,32")
    ap.add_argument("--backend", default="onnxruntime-cpu")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--round-to", type=int, default=None, help="a fixed channel multiple instead of the measured one")
    ap.add_argument("--repeats", type=int, default=80, help="timed calls per network, interleaved")
    ap.add_argument("--cache-dir", default="runs/cache/latency")
    ap.add_argument("--json", type=Path, default=Path("runs/latency-model.json"))
    args = ap.parse_args(argv)
    shape = [int(x) for x in args.input_size.split(",")]
    # the target only names the backend and batch here: any reachable speed-up will do
    target = TargetConfig(backend=args.backend, batch=args.batch, speedup=1.01)
    cfg = PruneConfig(round_to=args.round_to, aim={"cache_dir": args.cache_dir})
    results = []
    for name in args.models:
        res = probe(name, shape, target, cfg, args.repeats)
        results.append(res)
        print(f"{name}: full {res['full_ms']:.3f} ms, channel multiple {res['channel_multiple']['multiple']}")
        for row in res["candidates"]:
            print(
                f"  {row['candidate']:<12} predicted {row['predicted_ms']:.3f} ms  measured {row['measured_ms']:.3f} ms"
                f"  error {row['error']:+.1%}"
            )
    worst = max(abs(r["error"]) for res in results for r in res["candidates"])
    print(f"largest error: {worst:.1%} ({cpu_name()}, {args.backend}, batch {args.batch})")
    write_json(args.json, {"cpu": cpu_name(), "backend": args.backend, "batch": args.batch, "results": results})
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
