"""Data efficiency: the selectors (on known signals and on every modality), the select stage and
its resume, selective backprop and weighted coresets in the one loop, calibration selection,
and clear errors for bad budgets and unknown selectors."""

import json

import numpy as np
import pytest
import torch

from effvision.data.selectors import Signals, class_quota, resolve_budget, select
from effvision.errors import EffvisionError
from effvision.registry import SELECTORS


def _signals(n=120, c=4, d=8, seed=0) -> Signals:
    rng = np.random.default_rng(seed)
    t = np.arange(n) % c
    probs = rng.dirichlet(np.ones(c), n).astype(np.float32)
    return Signals(
        t,
        c,
        rng.standard_normal((n, d)).astype(np.float32),
        probs,
        np.linalg.norm(probs - np.eye(c)[t], axis=1),
        rng.integers(0, 4, n).astype(float),
    )


def test_class_quota_is_proportional_and_sums_to_the_budget():
    t = np.array([0] * 50 + [1] * 30 + [2] * 20)
    assert class_quota(t, 10, 3).tolist() == [5, 3, 2]
    assert class_quota(t, 7, 3).sum() == 7 and class_quota(t, 100, 3).tolist() == [50, 30, 20]


def test_score_selectors_keep_the_hardest_or_the_easiest():
    s = _signals()
    top = np.argsort(-s.el2n)[:12]
    assert set(select("el2n", s, 12).indices) == set(top)
    assert set(select("el2n", s, 12, keep="easy").indices) == set(np.argsort(s.el2n)[:12])
    ent = -(s.probs * np.log(s.probs)).sum(1)
    assert set(select("entropy", s, 10).indices) == set(np.argsort(-ent)[:10])
    srt = np.sort(s.probs, 1)
    assert set(select("margin", s, 10).indices) == set(np.argsort(srt[:, -1] - srt[:, -2])[:10])
    grand = np.linalg.norm(s.probs - s.onehot(), axis=1) * np.sqrt((s.embeddings**2).sum(1) + 1)
    assert set(select("grand", s, 10).indices) == set(np.argsort(-grand)[:10])
    s.forgetting[:5] = np.inf  # never learned: kept first
    assert set(range(5)) <= set(select("forgetting", s, 8).indices)


def test_kcenter_covers_every_cluster_and_random_does_not_have_to():
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((6, 5)) * 50
    big = np.repeat(np.arange(6), [200, 4, 4, 4, 4, 4])  # one crowded cluster, five small ones
    emb = (centres[big] + rng.standard_normal((len(big), 5))).astype(np.float32)
    s = Signals(np.zeros(len(big), int), 1, emb)
    picked = select("kcenter", s, 6, seed=3).indices
    assert sorted(set(big[picked])) == list(range(6))
    hits = [len(set(big[select("random", s, 6, seed=k).indices])) for k in range(10)]
    assert min(hits) < 6


def test_herding_matches_the_class_mean_better_than_random():
    s = _signals(n=400, c=2, d=6, seed=1)
    unit = s.embeddings / np.linalg.norm(s.embeddings, axis=1, keepdims=True)

    def gap(idx):
        return sum(
            np.linalg.norm(unit[idx][s.targets[idx] == c].mean(0) - unit[s.targets == c].mean(0)) for c in range(2)
        )

    herd = gap(select("herding", s, 20).indices)
    assert herd < min(gap(select("random", s, 20, seed=k).indices) for k in range(5))


def test_gradient_clusters_keep_one_per_duplicate_group_weighted_by_its_size():
    rng = np.random.default_rng(0)
    groups = np.repeat(np.arange(4), [10, 5, 3, 2])  # 4 groups of identical samples in one class
    emb = rng.standard_normal((4, 3)).astype(np.float32)[groups] * 10
    probs = np.tile(np.array([[0.5, 0.5]], np.float32), (len(groups), 1))
    s = Signals(np.zeros(len(groups), int), 2, emb, probs)
    sel = select("gradient_clusters", s, 4, seed=0)
    assert sorted(groups[sel.indices]) == [0, 1, 2, 3]
    sizes = dict(zip(groups[sel.indices], sel.weights, strict=True))
    assert np.allclose([sizes[g] for g in range(4)], np.array([10, 5, 3, 2]) / 5)  # weights have mean 1


def test_forgetting_counter_counts_lost_samples_and_never_learned_ones():
    from effvision.compression.selection import ForgettingCounter

    c = ForgettingCounter(3)
    idx = torch.tensor([0, 1, 2])
    y = torch.tensor([0, 0, 0])
    for right in ([1, 1, 0], [0, 1, 0], [1, 1, 0], [0, 1, 0]):  # sample 0 forgotten twice, 1 never, 2 never learned
        logits = torch.tensor([[1.0, 0.0] if r else [0.0, 1.0] for r in right])
        c(idx, logits, y)
    assert c.counts().tolist() == [2.0, 0.0, np.inf]


@pytest.mark.parametrize(
    "budget,msg",
    [
        (0, "between 1 and"),
        (0.0, r"in \(0, 1\]"),
        (-0.2, r"in \(0, 1\]"),
        (1.5, r"in \(0, 1\]"),
        (121, "between 1 and the dataset size"),
        ("half", "fraction"),
    ],
)
def test_bad_budgets_are_clear_errors(budget, msg):
    with pytest.raises(EffvisionError, match=msg):
        resolve_budget(budget, 120)


def test_unknown_selector_and_option_are_clear_errors():
    with pytest.raises(EffvisionError, match="did you mean 'kcenter'"):
        select("kcentre", _signals(), 10)
    with pytest.raises(EffvisionError, match="unknown option keepp"):
        select("el2n", _signals(), 10, keepp="easy")


# ----------------------------------------------------------------------------- every modality
def _image_data():
    from effvision.data import load_dataset
    from effvision.recipe import DataConfig

    return (
        load_dataset(DataConfig(name="digits", max_train_samples=40, max_val_samples=20, batch_size=8)),
        "cifar_resnet8",
        {"width": 0.25},
    )


def _video_data(tmp_path, monkeypatch):
    from test_video import _video_config, _video_tree

    from effvision.data import load_dataset
    from effvision.data.cards import DatasetCard

    card = DatasetCard(
        name="videofolder", modality="video", source="videofolder", image_size=32, num_frames=4, hflip=False
    )
    monkeypatch.setattr("effvision.data.get_card", lambda name: card)
    return (
        load_dataset(_video_config(_video_tree(tmp_path, bad=False))),
        "tsm",
        {"backbone": "cifar_resnet8", "width": 0.25},
    )


def _points_data(tmp_path, monkeypatch):
    pytest.importorskip("open3d", exc_type=ImportError, reason="open3d (or libusb-1.0) is not available")
    from pathlib import Path

    import yaml

    from effvision.data import load_dataset
    from effvision.recipe import DataConfig

    (tmp_path / "data").mkdir()
    card = yaml.safe_load((Path(__file__).resolve().parents[1] / "data/synthetic-shapes.yaml").read_text())
    card.update(
        name="tiny-shapes",
        num_points=64,
        cache_points=128,
        generate={"train_per_class": 3, "val_per_class": 1, "points": 128},
    )
    (tmp_path / "data/tiny-shapes.yaml").write_text(yaml.safe_dump(card))
    monkeypatch.setenv("EFFVISION_HOME", str(tmp_path))
    data = load_dataset(DataConfig(name="tiny-shapes", root=str(tmp_path / "shapes"), batch_size=8))
    return data, "pointnet", {"width": 0.25}


@pytest.mark.parametrize("modality", ["image", "video", "points"])
def test_every_selector_works_on_every_modality(modality, tmp_path, monkeypatch):
    """One proxy (2 epochs) scores a tiny dataset of each modality; every registered selector
    then keeps half of it, class quotas respected where the selector balances classes."""
    from effvision.compression.selection import ProxyConfig, score
    from effvision.models import create_model

    data, arch, kwargs = {
        "image": lambda: _image_data(),
        "video": lambda: _video_data(tmp_path, monkeypatch),
        "points": lambda: _points_data(tmp_path, monkeypatch),
    }[modality]()
    scored = score(
        data,
        SELECTORS.names(),
        ProxyConfig(epochs=2),
        lambda: create_model(arch, num_classes=data.num_classes, input_size=data.input_size, **kwargs),
        torch.device("cpu"),
    )
    s = scored.signals
    assert scored.proxy_train_s > 0 and s.embeddings.shape[0] == len(data.train) == s.probs.shape[0]
    assert np.allclose(s.probs.sum(1), 1, atol=1e-4) and s.forgetting is not None
    n = len(data.train) // 2
    quota = class_quota(s.targets, n, s.num_classes)
    for name in SELECTORS.names():
        sel = select(name, s, 0.5, seed=1)
        assert len(sel.indices) == len(set(sel.indices.tolist())) == n, name
        assert 0 <= sel.indices.min() and sel.indices.max() < len(data.train)
        if name in ("class_balanced", "herding", "gradient_clusters"):
            assert np.bincount(s.targets[sel.indices], minlength=s.num_classes).tolist() == quota.tolist(), name
    sub = data.with_train_subset(sel.indices, sel.weights)
    assert len(sub.train) == n and next(iter(sub.train_loader(4, with_index=True)))[2].max() < n


def test_the_default_proxy_is_a_narrower_copy_scored_by_its_own_training(monkeypatch):
    from effvision.compression import selection
    from effvision.compression.selection import ProxyConfig, narrowed, score
    from effvision.models import create_model

    data, arch, kwargs = _image_data()
    make = lambda: create_model(arch, num_classes=data.num_classes, **kwargs)  # noqa: E731
    full = sum(p.numel() for p in make().parameters())
    assert sum(p.numel() for p in narrowed(make(), 0.5).parameters()) < 0.4 * full  # about a quarter
    assert ProxyConfig().width == 0.5 and ProxyConfig().scores == "training"
    passes = []
    real = selection.embeddings_and_probs
    monkeypatch.setattr(
        selection, "embeddings_and_probs", lambda m, loader, d: passes.append(len(loader.dataset)) or real(m, loader, d)
    )
    scored = score(data, ["el2n", "forgetting"], ProxyConfig(epochs=2), make, torch.device("cpu"))
    s = scored.signals
    # no pass over the split: only the few samples a dropped last batch hid in the last epoch are passed
    assert all(n < len(data.train) // 2 for n in passes) and s.embeddings is None
    assert np.isfinite(s.probs).all() and np.allclose(s.probs.sum(1), 1, atol=1e-4) and s.forgetting is not None
    assert np.allclose(s.el2n, np.linalg.norm(s.probs - np.eye(data.num_classes)[s.targets], axis=1), atol=1e-5)
    passes.clear()
    score(data, ["el2n"], ProxyConfig(epochs=2, scores="pass"), make, torch.device("cpu"))
    assert passes == [len(data.train)]


# ----------------------------------------------------------------------------- the loop
def test_selective_backprop_trains_on_the_hardest_fraction(monkeypatch):
    from effvision.models import create_model
    from effvision.train import loop
    from effvision.train.config import TrainSettings

    data = _image_data()[0]
    kept, trained = [], []
    real = loop.hardest
    monkeypatch.setattr(loop, "hardest", lambda losses, f: kept.append((losses, real(losses, f))) or kept[-1][1])
    model = create_model("cifar_resnet8", width=0.25)
    model.register_forward_pre_hook(lambda m, args: trained.append(len(args[0])) if torch.is_grad_enabled() else None)
    res = loop.fit(
        model, data, TrainSettings(epochs=2, hard_fraction=0.25, optimizer="adamw", lr=3e-3), torch.device("cpu")
    )
    assert res.history and len(kept) == len(trained) == 2 * (len(data.train) // 8)
    for (losses, k), n in zip(kept, trained, strict=True):
        rest = torch.ones(len(losses), dtype=torch.bool)
        rest[k] = False
        assert len(k) == n == -(-len(losses) // 4)  # a quarter of each batch, rounded up, gets a backward pass
        assert losses[k].min() >= losses[rest].max()  # ... and it is the highest-loss quarter


def test_uniform_weights_train_exactly_like_no_weights():
    from effvision.models import create_model
    from effvision.train.config import TrainSettings
    from effvision.train.loop import fit

    data = _image_data()[0]
    a, b = create_model("cifar_resnet8", width=0.25), create_model("cifar_resnet8", width=0.25)
    b.load_state_dict(a.state_dict())
    s = TrainSettings(epochs=1, optimizer="adamw", lr=3e-3)
    fit(a, data, s, torch.device("cpu"))
    weighted = data.with_train_subset(range(len(data.train)), np.ones(len(data.train)))
    fit(b, weighted, s, torch.device("cpu"))
    assert all(torch.allclose(p, q, atol=1e-6) for p, q in zip(a.parameters(), b.parameters(), strict=True))


# ----------------------------------------------------------------------------- stage, calibration, errors
def _recipe(tmp_path, **select_over):
    from conftest import INT8_ALWAYS, tiny_recipe

    raw = tiny_recipe(
        stages=[
            {"type": "select", "selector": "kcenter", "budget": 100, "proxy": {"epochs": 1}, **select_over},
            {"name": "baseline", "type": "train", "epochs": 1, "optimizer": "adamw", "lr": 3e-3, "hard_fraction": 0.5},
            {"type": "quantize", "calibration": {"selector": "kcenter", "n": 32}, **INT8_ALWAYS},
        ]
    )
    path = tmp_path / "r.yaml"
    path.write_text(json.dumps(raw))
    return path


def test_select_stage_trains_later_stages_on_the_subset_and_resumes(tmp_path):
    from effvision.fileio import read_json
    from effvision.pipeline import run_pipeline
    from effvision.recipe import load_recipe
    from effvision.run_context import RunContext

    recipe = load_recipe(str(_recipe(tmp_path)))
    report = run_pipeline(recipe, tmp_path / "run")
    sel = report["stages"][0]
    assert sel["type"] == "select" and sel["selected"] == 100 and sel["of"] == 400 and sel["accuracy"] is None
    assert (
        report["stages"][2]["evaluated_with"] == "onnxruntime"
        and report["stages"][2]["calibration"]["selector"] == "kcenter"
    )
    saved = json.loads((tmp_path / "run/stages/1-select/selection.json").read_text())
    assert len(saved["indices"]) == 100 and "Selection (select): 100 of 400" in (tmp_path / "run/report.md").read_text()
    again = run_pipeline(recipe, tmp_path / "run")  # everything resumes
    assert [s["wall_s"] for s in again["stages"]] == [s["wall_s"] for s in report["stages"]]
    ctx = RunContext(recipe, tmp_path / "run")
    ctx.adopt(read_json(tmp_path / "run/stages/1-select/metrics.json"))
    assert len(ctx.data.train) == 100 and sorted(ctx.data.train.indices) == saved["indices"]


def test_bad_select_stages_are_one_line_errors(tmp_path, capsys):
    from effvision.cli import main

    path = _recipe(tmp_path)
    for sets, msg in (
        (["stages.0.budget=0"], "budget"),
        (["stages.0.budget=401"], "between 1 and the dataset size (400)"),
        (["stages.0.budget=1.5"], r"in (0, 1]"),
        (["stages.0.selector=kcentre"], "did you mean 'kcenter'"),
        (["stages.2.calibration.selector=randm"], "did you mean 'random'"),
        (["stages.0.selector=forgetting"], "at least 2 epochs"),
    ):
        code = main(
            ["compress", str(path), "--run-dir", str(tmp_path / "bad"), *[a for s in sets for a in ("--set", s)]]
        )
        err = capsys.readouterr().err
        assert code == 1 and msg in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, (sets, err)


def test_calibration_scores_a_bounded_pool(monkeypatch):
    from effvision.compression import selection
    from effvision.data.selectors import CalibrationConfig
    from effvision.models import create_model

    data = _image_data()[0]
    seen = []
    real = selection.embeddings_and_probs
    monkeypatch.setattr(
        selection, "embeddings_and_probs", lambda m, loader, d: seen.append(len(loader.dataset)) or real(m, loader, d)
    )
    model = create_model("cifar_resnet8", width=0.25)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    idx = selection.calibration_indices(
        data, CalibrationConfig(selector="kcenter", n=8, pool=16), model, torch.device("cpu"), seed=2
    )
    assert seen == [16] and len(set(idx.tolist())) == 8 and max(idx) < len(data.train)
    after = model.state_dict()  # the model being quantized scores as it is: not narrowed, not changed
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    plain = selection.calibration_indices(data, CalibrationConfig(n=8), model, torch.device("cpu"))
    assert seen == [16] and len(plain) == 8  # class_balanced needs no model output at all
