"""Widths chosen by measured accuracy (width_search.py): the candidates meet the latency goal and
are pruned no further than it needs, they are scored by top-1 without training, and the one
taken is the most accurate that measures within the goal."""

from __future__ import annotations

import pytest
import torch

from effvision.compression.align import at_widths
from effvision.compression.finetune import recalibrate_batchnorm
from effvision.compression.latency import grid
from effvision.compression.latency_prune import channel_groups, layer_widths
from effvision.compression.width_search import (
    candidate_widths,
    candidates_around,
    choose_widths,
    layers_at,
    score_candidates,
)
from effvision.data import DataConfig, load_dataset
from effvision.models import create_model
from effvision.scoring import accuracy, torch_predictor

CPU = torch.device("cpu")


class MacLatency:
    """A latency model's stand-in: a network takes the sum of its layers' cin * cout."""

    def line(self):
        return 0.0, 1.0

    def table_sum(self, widths):
        return sum(cin * cout for cin, cout in widths.values())

    def predict(self, widths):
        return self.table_sum(widths)


def _resnet8_at_60_percent():
    """An untrained ResNet-8, its groups and widths, the MAC stand-in and a goal of 60% of it."""
    model = create_model("cifar_resnet8", num_classes=10).eval()
    groups = channel_groups(model)
    current = layer_widths(model)
    lat = MacLatency()
    return model, groups, {g.root: g.width for g in groups}, current, lat, 0.6 * lat.table_sum(current)


@pytest.mark.parametrize("multiple, rest", [(16, "grid"), (8, "random")])  # 4,096 vectors; 65,536
def test_candidates_meet_the_goal_and_are_no_narrower_than_it_needs(multiple, rest):
    model, groups, original, current, lat, goal = _resnet8_at_60_percent()
    planned = {g.root: g.width // 2 for g in groups}  # a planner's answer, well past the goal
    found = candidate_widths(groups, original, current, lat, goal, multiple, 12, planned)
    kinds = [k for k, _ in found]
    assert kinds[:2] == ["planned", "uniform"] and len(found) == 12 and set(kinds[2:]) == {rest}, kinds
    vectors = [tuple(w[g.root] for g in groups) for _, w in found]
    assert len(set(vectors)) == len(vectors)
    for kind, widths in found:
        assert lat.predict(layers_at(groups, current, widths)) <= goal, (kind, widths)
        assert all(w % multiple == 0 and w >= original[r] / 8 for r, w in widths.items()), widths
        if kind != "grid":
            continue
        for g in groups:  # one level wider in any group misses the goal
            wider = [w for w in grid(g.width, multiple) if w > widths[g.root]]
            if wider:
                assert lat.predict(layers_at(groups, current, {**widths, g.root: wider[0]})) > goal, (kind, g.root)
    # the uniform cut: one fraction f of every group, each rounded up to its next level (the level
    # below is under f of the width, the one taken is not)
    uniform = found[1][1]
    below = [max([w for w in grid(g.width, multiple) if w < uniform[g.root]], default=0) / g.width for g in groups]
    assert max(below) < min(uniform[g.root] / g.width for g in groups), (uniform, below)
    # layers_at scales each layer's widths by its groups' fractions
    half = at_widths(model, groups, planned)
    assert layers_at(groups, current, planned) == {n: (float(a), float(b)) for n, (a, b) in layer_widths(half).items()}


def test_relaxed_candidates_are_flagged_by_their_prediction():
    model, groups, original, current, lat, goal = _resnet8_at_60_percent()
    found = candidates_around(groups, original, current, lat, goal, 16, 10, slack=0.15)
    assert len(found) == 10 and len({tuple(sorted(c["widths"].items())) for c in found}) == 10
    for c in found:
        ms = lat.table_sum(layers_at(groups, current, c["widths"]))
        assert c["predicted_ms"] == round(ms, 4) and c["predicted_met"] == (ms <= goal) and ms <= 1.15 * goal, c
    assert sum(c["predicted_met"] for c in found) == 5  # half within the goal, half within the slack


def test_the_most_accurate_candidate_measured_within_the_goal_is_taken():
    """Timed in order of accuracy: the most accurate runs too slow, the next is taken and no
    other is timed; when none of those timed is fast enough, the most accurate predicted to be."""
    cands = [
        {"kind": "grid", "widths": {"a": w}, "top1": t, "predicted_met": met}
        for w, t, met in ((1, 0.5, True), (2, 0.9, False), (3, 0.8, True), (4, 0.7, True))
    ]
    ms = {1: 0.5, 2: 1.2, 3: 0.9, 4: 0.8}
    timed = []

    def measure(widths):
        timed.append(widths["a"])
        return ms[widths["a"]]

    assert choose_widths(cands, 1.0, measure)["widths"] == {"a": 3} and timed == [2, 3]
    assert [c.get("chosen", False) for c in cands] == [False, False, True, False]
    for c in cands:
        c.pop("chosen", None), c.pop("measured_ms", None)
    timed.clear()
    assert choose_widths(cands, 0.6, measure, limit=2)["widths"] == {"a": 3} and timed == [2, 3]


def test_candidates_are_scored_by_accuracy_on_training_images():
    """The zoo's digits ResNet-8: every group at its floor against one group a quarter thinner.
    The second scores higher, and it is the more accurate on the validation split too (the
    scores are taken on the images given: training images here)."""
    torch.manual_seed(0)
    data = load_dataset(DataConfig(name="digits", max_train_samples=600, max_val_samples=300))
    model = create_model("cifar_resnet8_100.digits", pretrained="zoo").eval()
    groups = channel_groups(model)
    floor = {g.root: max(1, g.width // 8) for g in groups}
    mild = {g.root: g.width for g in groups}
    mild[groups[-1].root] = groups[-1].width * 3 // 4
    cands = [{"kind": "grid", "widths": floor}, {"kind": "grid", "widths": mild}]
    score_candidates(model, groups, cands, data, CPU, data.train_eval_loader())
    assert cands[1]["top1"] > cands[0]["top1"] + 0.2, cands

    def val_top1(widths):
        copy = at_widths(model, groups, widths)
        recalibrate_batchnorm(copy, data)
        return accuracy(torch_predictor(copy, CPU), data.val_loader())

    assert val_top1(mild) > val_top1(floor) + 0.2
