"""`effvision study pareto`: the recipe at each target against uniform pruning at the same measured
latency, timed side by side; a rerun resumes; bad targets are one line."""

from __future__ import annotations

import json

import pytest
import yaml

from effvision.cli import main


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    """The zoo's digits ResNet-8 aimed at 1.3x in one step (and uniform pruning matched to it)."""
    tmp = tmp_path_factory.mktemp("pareto")
    raw = {
        "name": "pareto-digits",
        "data": {"name": "digits", "max_train_samples": 400},
        "model": {"name": "cifar_resnet8_100.digits", "pretrained": "zoo"},
        "target": {"speedup": 2.0, "batch": 1},  # the study replaces the speed-up
        "stages": [
            {
                "type": "prune",
                "aim": {"steps": 1, "cache_dir": str(tmp / "cache")},
                "finetune": {"step_epochs": 1, "epochs": 1},
            },
            {"type": "export"},
        ],
    }
    recipe = tmp / "pareto.yaml"
    recipe.write_text(yaml.safe_dump(raw))
    return recipe


@pytest.fixture(scope="module")
def study(recipe):
    """The study run (110 to 185 s on 2 cores: a latency table, a ratio search, four pipelines),
    so its tests are slow ones (make test-all, make bench)."""
    out = recipe.parent / "study"
    code = main(["study", "pareto", str(recipe), "--targets", "1.3", "--out", str(out)])
    return code, recipe, out


@pytest.mark.slow
def test_pareto_study_compares_with_uniform_pruning_at_matched_latency(study):
    code, _, out = study
    assert code == 0
    saved = json.loads((out / "results.json").read_text())
    summary = saved["summary"]
    points = {p["method"]: p for p in summary["points"]}
    aimed, uniform = points["latency-aware"], points["uniform"]
    assert aimed["target"] == uniform["target"] == 1.3 and aimed["met"] is True
    # the uniform ratio was chosen by measurement to run as fast as the aimed model: the closest of
    # its tries, each timed beside the aimed model, within 10% of its speed (3% ends the search
    # early); the shipped files, timed again side by side at the end, within 30% (one timing on a
    # shared 2-core machine moves by 20%: 1.39x against 1.15x for a matched pair)
    rows = {r["method"]: r for r in saved["rows"]}
    search = rows["uniform"]["ratio_search"]
    (c,) = summary["comparisons"]
    closest = min(abs(t["relative"] - 1) for t in search["tried"])
    assert search["matched"] == (abs(search["relative"] - 1) <= 0.1) == c["matched"], search
    assert abs(search["relative"] - 1) == closest and len(search["tried"]) >= 1
    assert all(t["aimed_speedup"] > 1.1 for t in search["tried"])  # the aimed model timed beside every try
    if not search["matched"]:
        # Speed is not monotone in the ratio on every CPU: on an AMD EPYC with AVX-512 (2026-12-03)
        # every ratio from 0.015 up measured 1.67x or more against an aimed 1.40x (rounding the
        # channels to a multiple alone pays there). The table must say the pair is not matched.
        assert "no uniform ratio measured within 10%" in (out / "pareto.md").read_text()
    else:
        assert abs(uniform["latency_ms"] / aimed["latency_ms"] - 1) < 0.3, (aimed, uniform)
    assert 0 < uniform["ratio"] < 0.95 and aimed["speedup"] > 1.1 and uniform["speedup"] > 1.1
    assert c["accuracy_gain"] == pytest.approx(aimed["accuracy"] - uniform["accuracy"], abs=1e-6)
    assert summary["reference"]["accuracy"] is None  # the recipe has no bench stage
    assert all(0 < p["accuracy"] <= 1 for p in summary["points"])
    # the uniform run pruned one ratio in as many steps as the aimed run took (extra steps too) and
    # trained as many epochs: 1 after each aimed step and 1 at the end, against 1 between uniform
    # steps and the last step's 1 plus 1 in its distill stage
    uniform_report = json.loads((out / "uniform-1.3x/report.json").read_text())
    assert [s["type"] for s in uniform_report["stages"]] == ["prune", "distill", "export"]
    stage = lambda run, d: json.loads((out / run / "stages" / d / "metrics.json").read_text())  # noqa: E731
    steps = len(stage("latency-aware-1.3x", "1-prune")["aim"]["steps"])
    assert stage("uniform-1.3x", "1-prune")["epochs_between_steps"] == steps - 1
    assert stage("uniform-1.3x", "2-prune-distill")["history"][-1]["epoch"] == 2
    assert (out / "pareto.md").is_file() and (out / "pareto.png").is_file() and (out / "pareto-size.png").is_file()


@pytest.mark.slow
def test_a_rerun_resumes_without_running_a_recipe_again(study, monkeypatch):
    _, recipe, out = study

    def measured_rows() -> list[dict]:  # the final side-by-side timing is taken again on every run
        rows = json.loads((out / "results.json").read_text())["rows"]
        return [{k: v for k, v in r.items() if k not in ("speedup", "latency_ms")} for r in rows]

    before = measured_rows()

    def no_run(*a, **k):
        raise AssertionError("a finished row ran again")

    monkeypatch.setattr("effvision.pipeline.run_pipeline", no_run)
    assert main(["study", "pareto", str(recipe), "--targets", "1.3", "--out", str(out)]) == 0
    assert measured_rows() == before


@pytest.mark.parametrize(
    "args,words",
    [
        (["--targets", "1,2"], ["--targets 1,2", "each > 1"]),
        (["--targets", "two"], ["--targets two"]),
        (["--set", "target=null"], ["needs a prune stage that aims at a target"]),
    ],
)
def test_bad_study_arguments_are_one_line(recipe, args, words, capsys, tmp_path):
    capsys.readouterr()
    code = main(["study", "pareto", str(recipe), *args, "--out", str(tmp_path / "s")])
    err = capsys.readouterr().err.strip()
    assert code == 1 and len(err.splitlines()) == 1 and "Traceback" not in err, (code, err)
    assert all(w in err for w in words), err
    assert not (tmp_path / "s").exists()
