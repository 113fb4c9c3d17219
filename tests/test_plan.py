"""A target spent cheapest-accuracy first: the plan stage measures int8 and lower input sizes on
the uncompressed model, keeps what meets the target at the least accuracy within the floor, and
the later stages work at what it kept (a lower size recovers by distillation from the full-size
model; pruning aims only at the remainder, in the precision that ships)."""

from __future__ import annotations

import json
from pathlib import Path

import onnxruntime as ort
import pytest
import yaml

from effvision.cli import main
from effvision.compression.plan import choose
from effvision.errors import EffvisionError
from effvision.goals import FastestWithinFloor


def lever(name, speedup, cost):
    precision, size = name.split("@")
    return {"lever": name, "precision": precision, "size": int(size), "speedup": speedup, "cost": cost}


def test_the_plan_keeps_the_cheapest_lever_that_meets_the_target_within_the_floor():
    levers = [
        lever("fp32@32", 1.0, 0.0),
        lever("int8@32", 2.2, 0.002),
        lever("fp32@24", 1.7, 0.004),
        lever("int8@24", 3.6, 0.012),
    ]
    kept, meets, why = choose(levers, 2.0, 0.01, 0.05)
    assert kept["lever"] == "int8@32" and meets and "least accuracy" in why  # 2.2 >= 2.0 x 1.05
    # a goal no lever within the floor meets: the fastest within it, pruning takes the rest
    kept, meets, why = choose(levers, 3.0, 0.01, 0.05)
    assert kept["lever"] == "int8@32" and not meets and "remaining 1.36x" in why
    # int8@24 meets 3x, but only a looser floor admits it
    kept, meets, _ = choose(levers, 3.0, 0.02, 0.05)
    assert kept["lever"] == "int8@24" and meets
    # no floor: the least loss among those that meet (ties to the faster)
    assert choose(levers, 1.5, None, 0.05)[0]["lever"] == "int8@32"
    assert choose([*levers, lever("fp32@28", 1.6, 0.002)], 1.5, None, 0.05)[0]["lever"] == "int8@32"
    # nothing but the reference within a floor of zero
    assert choose(levers, 2.0, 0.0, 0.05)[0]["lever"] == "fp32@32"


RECIPE = {
    "name": "planned",
    "seed": 0,
    "data": {"name": "digits", "max_train_samples": 600, "batch_size": 64},
    "model": {"name": "cifar_resnet8_100.digits", "pretrained": "zoo"},
    "target": {"speedup": 1.3, "batch": 1, "max_drop": 0.02, "resolutions": [24]},
    "stages": [
        {"type": "plan", "score_samples": 400, "calibration": {"n": 64}, "repeats": 40},
        {"type": "prune", "aim": {"steps": 1, "repeats": 20}, "finetune": {"step_epochs": 0, "epochs": 1}},
        {"type": "export"},
        {"type": "quantize", "calibration": {"n": 64}, "require_faster": False},
        {"type": "bench", "batches": [1], "repeats": 20},
    ],
}


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("planned")
    recipe = tmp / "planned.yaml"
    recipe.write_text(yaml.safe_dump(RECIPE))
    run = tmp / "run"
    code = main(["compress", str(recipe), "--run-dir", str(run)])
    return code, run, recipe


def test_the_plan_is_measured_kept_and_followed(planned):
    code, run, _ = planned
    report = json.loads((run / "report.json").read_text())
    plan = report["plan"]
    assert [lv["lever"] for lv in plan["levers"]] == ["fp32@32", "fp32@24", "int8@32", "int8@24"]
    for lv in plan["levers"]:
        assert lv["p50_ms"] > 0 and 0 <= lv["top1"] <= 1 and (run / lv["file"]).is_file()
        assert lv["cost"] == pytest.approx(plan["reference"]["top1"] - lv["top1"], abs=1e-6)
    assert "held out for decisions" in plan["scored_on"] and plan["goal_speedup"] == 1.3
    # what it kept is what the rule gives on what it measured
    kept, meets, _ = choose([dict(lv) for lv in plan["levers"]], 1.3, 0.02, 0.05)
    assert plan["kept"]["lever"] == kept["lever"] and plan["prune"] is not meets
    assert [lv["lever"] for lv in plan["levers"] if lv.get("kept")] == [kept["lever"]]
    prune = next(s for s in report["stages"] if s["type"] == "prune")
    if meets:
        assert prune["aim"]["met_by_plan"]["lever"] == kept["lever"]
    else:
        assert prune["aim"]["precision"] == kept["precision"] and prune["aim"]["remainder"] > 1
    # every stage after the plan works at the size it kept; the reference stays at the model's own
    size = plan["kept"]["size"]
    assert all(s["input_size"] == [3, size, size] for s in report["stages"] if s["type"] in ("prune", "quantize"))
    shipped = run / report["artifacts"]["onnx"]
    session = ort.InferenceSession(str(shipped))
    assert session.get_inputs()[0].shape[1:] == [3, size, size]
    meta = json.loads(session.get_modelmeta().custom_metadata_map["effvision"])
    assert meta["preprocessing"]["size"] == size  # predict and the bundle resize to what the file takes
    reference = ort.InferenceSession(str(run / "stages/5-bench/reference.onnx"))
    assert reference.get_inputs()[0].shape[1:] == [3, 32, 32]
    md = (run / "report.md").read_text()
    assert "Plan for 1.30x on onnxruntime-cpu" in md and f"Kept {kept['lever']}:" in md
    assert code in (0, 1)  # the target's verdict is a timing on a shared machine: the report says it


def test_every_field_a_planned_run_writes_is_described(planned):
    # the plan, the target and the aimed prune stage's fields are in the report.json schema
    from effvision.report_fields import undescribed

    report = json.loads((planned[1] / "report.json").read_text())
    assert not undescribed(report), (
        f"report.json fields not described in effvision/report_fields.py: {undescribed(report)}"
    )


@pytest.mark.parametrize(
    "sets,words",
    [
        (["target.resolutions=[40]"], ["plan: target.resolutions lists 40 px", "larger than", "32 px"]),
        (["target.resolution=[24]"], ["target.resolution: unknown key", "did you mean 'resolutions'"]),
        (["target.resolutions=[4]"], ["target.resolutions", "at least 8 pixels"]),
    ],
)
def test_bad_plans_are_one_line_and_keep_the_finished_stages(planned, sets, words, capsys, tmp_path):
    import shutil

    _, run, recipe = planned
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    args = [a for s in sets for a in ("--set", s)]
    code = main(["compress", str(recipe), *args, "--run-dir", str(copy)])
    err = capsys.readouterr().err.strip()
    assert code == 1 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    for w in words:
        assert w in err, (w, err)
    assert (copy / "stages/0-init/model.pt").is_file()


def test_a_target_and_a_floor_that_cannot_both_be_met_name_the_best_file_on_each_side(tmp_path):
    from types import SimpleNamespace

    from effvision.compression.target_prune import floor_and_target

    plan = {
        "goal_speedup": 3.0,
        "max_drop": 0.005,
        "kept": {"lever": "int8@32", "precision": "int8"},
        "levers": [{"lever": "int8@32", "file": "stages/1-plan/levers/int8-32.onnx", "speedup": 2.2, "cost": 0.001}],
    }
    ctx = SimpleNamespace(stage_dir=tmp_path / "stages/2-prune", rel=lambda p: str(p.relative_to(tmp_path)))
    aimed = {"final": {"speedup": 3.1}, "floor": {"top1": 0.97, "drop": 0.02, "held": False}}
    with pytest.raises(EffvisionError) as err:
        floor_and_target(ctx, plan, aimed)
    line = str(err.value)
    assert "cannot both be met" in line and "the floor bound" in line and "\n" not in line
    assert "stages/1-plan/levers/int8-32.onnx (int8@32, 2.20x" in line and "stages/2-prune/model.pt (3.10x" in line
    floor_and_target(ctx, plan, {**aimed, "floor": {**aimed["floor"], "held": True}})  # held: nothing said


def test_a_floor_alone_asks_for_the_fastest_file_within_it():
    from effvision.recipe import RecipeError
    from effvision.stages import load_recipe

    # no speed goal: the plan keeps the fastest lever within the floor and pruning goes on
    levers = [lever("fp32@32", 1.0, 0.0), lever("int8@32", 2.2, 0.002), lever("int8@24", 3.6, 0.012)]
    kept, meets, why = choose(levers, None, 0.01, 0.05)
    assert kept["lever"] == "int8@32" and not meets and "while the floor holds" in why
    raw = {**RECIPE, "target": {"max_drop": 0.01}}
    raw["stages"] = [dict(s) for s in RECIPE["stages"]]
    raw["stages"][1] = {"type": "prune", "aim": {"steps": 3}, "finetune": {"step_epochs": 1, "epochs": 1}}
    assert isinstance(load_recipe_from(raw, load_recipe).target.goal, FastestWithinFloor)
    with pytest.raises(RecipeError, match="max_drop alone"):  # nothing asked at all
        load_recipe_from({**raw, "target": {"backend": "onnxruntime-cpu"}}, load_recipe)
    with pytest.raises(RecipeError, match="needs a plan stage before prune"):
        load_recipe_from({**raw, "stages": raw["stages"][1:]}, load_recipe)
    one_step = [raw["stages"][0], {**raw["stages"][1], "aim": {"steps": 1}}, *raw["stages"][2:]]
    with pytest.raises(RecipeError, match="aim.steps >= 2 and finetune.step_epochs >= 1"):
        load_recipe_from({**raw, "stages": one_step}, load_recipe)


def load_recipe_from(raw: dict, load_recipe):
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "r.yaml"
        path.write_text(yaml.safe_dump(raw))
        return load_recipe(str(path))


@pytest.mark.slow  # two compress runs with step-wise pruning: about 8 min on 2 cores
def test_the_front_gives_the_fastest_file_within_each_floor(tmp_path, capsys):
    raw = {**RECIPE, "target": {"batch": 1, "max_drop": 0.02}}
    raw["stages"] = [dict(s) for s in RECIPE["stages"]]
    raw["stages"][1] = {
        "type": "prune",
        "aim": {"steps": 2, "candidates": 2, "repeats": 20},
        "finetune": {"step_epochs": 1, "epochs": 1},
    }
    recipe = tmp_path / "front.yaml"
    recipe.write_text(yaml.safe_dump(raw))
    out = tmp_path / "front"
    assert main(["study", "front", str(recipe), "--floors", "0.01,0.03", "--out", str(out)]) == 0
    summary = json.loads((out / "results.json").read_text())["summary"]
    assert [p["floor"] for p in summary["points"]] == [0.01, 0.03]
    for p in summary["points"]:
        report = json.loads((Path(p["run_dir"]) / "report.json").read_text())
        assert report["plan"]["goal_speedup"] is None and report["target"]["speedup"] is None
        steps = next(s for s in report["stages"] if s["type"] == "prune")["aim"]["steps"]
        # every step kept held the floor on the held-out images; a step that broke it was undone, the last
        assert all(s["floor"]["held"] for s in steps if not s.get("undone"))
        assert [s.get("undone", False) for s in steps].count(True) <= 1 and not any(s.get("undone") for s in steps[:-1])
        assert p["speedup"] > 1
    assert "| floor 1 points |" in (out / "front.md").read_text()
    assert main(["study", "front", str(recipe), "--floors", "1.5"]) == 1
    assert "--floors 1.5: give top-1 losses in [0, 1)" in capsys.readouterr().err


def test_a_model_meets_the_target_as_it_enters_only_by_two_measurements():
    """One reading can mislead on a shared machine (a Lite0 run's first read int8 alone at 2.05x,
    which the plan had measured at 1.38x): nothing is left unpruned on it alone."""
    from effvision.compression.target_prune import _met_twice

    class Aim:
        def __init__(self, second):
            self.second = second

        def met(self, m):
            return m["speedup"] >= 2.0

        def measure(self, model):
            return {"speedup": self.second}

    first = {"speedup": 2.05}
    record = {}
    assert not _met_twice(Aim(1.38), None, first, record)
    assert record["rechecks"] == [{"speedup": 1.38}]
    assert _met_twice(Aim(2.1), None, first, {})
    assert not _met_twice(Aim(2.1), None, {"speedup": 1.9}, {})
