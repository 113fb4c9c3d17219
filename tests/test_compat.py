"""The compatibility table's runtime columns: each other runtime's fp32 file of the pruned model,
judged as the ONNX file is; a runtime's failure, hang or crash is its own cell, the row kept."""

import pytest
from conftest import child_json, needs_openvino

from effvision.fileio import write_json, write_text
from effvision.zoo.compat import child_row, to_markdown
from effvision.zoo.conformance import STEPS, Conformance

# In a child process, as every test that loads OpenVINO (tests/test_openvino.py says why): a tiny
# network, and one that the ONNX export refuses (so does OpenVINO's, which starts from it), each
# through the conformance run with OpenVINO as the other runtime.
_BOTH = """
import json, tempfile, torch
from effvision.runtimes import runtime_named
from effvision.registry import MODELS
from effvision.zoo.conformance import run_conformance

class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.fc = torch.nn.Conv2d(3, 16, 3), torch.nn.Linear(16, 7)
    def forward(self, x):
        return self.fc(self.conv(x).mean((2, 3)))

class Sampler(Tiny):
    export_blocker = "torch.multinomial: sampling inside the network"

found = {}
for name, cls in (("tiny", Tiny), ("sampler", Sampler)):
    MODELS.register(name, lambda num_classes=7, cls=cls, **kw: cls())
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        r = run_conformance(name, [3, 16, 16], num_classes=7, workdir=tmp, runtimes=[runtime_named("openvino")],
                            on_row=lambda row: rows.append(dict(row.runtimes)))
    found[name] = {**r.as_dict(), "rows_so_far": rows}
print(json.dumps(found))
"""


@pytest.fixture(scope="module")
def conformed():
    return child_json(_BOTH)


@needs_openvino
def test_each_runtime_gets_the_pruned_model_as_its_file_and_is_judged_there(conformed):
    tiny = conformed["tiny"]
    assert tiny["ok"] and tiny["passed"] == list(STEPS)
    check = tiny["runtimes"]["openvino"]
    assert check["ok"] and check["reason"] is None and check["agreement"] == 1.0
    assert check["relative"] < 1e-4  # the export stage's bound
    # the row is on disk before the runtime starts and after it ends: a hang there keeps the row
    assert [sorted(r) for r in tiny["rows_so_far"]] == [[], ["openvino"]]


@needs_openvino
def test_a_runtime_that_refuses_the_model_is_its_cell(conformed):
    sampler = conformed["sampler"]
    assert sampler["failed_step"] == "export"  # the row's own verdict stands
    check = sampler["runtimes"]["openvino"]
    assert not check["ok"] and "multinomial" in check["reason"] and "\n" not in check["reason"]


def _stopped_child(tmp_path, trace: str) -> Conformance:
    row = Conformance("timm:m", [3, 32, 32], passed=list(STEPS), seconds=12.0)
    row.runtimes["openvino"] = {"ok": True, "reason": None, "relative": 3e-7, "agreement": 1.0}
    write_json(tmp_path / "result.json", row.as_dict())  # the row so far, as the child leaves it
    write_text(tmp_path / "step.txt", "runtime litert")
    write_text(tmp_path / "trace.txt", trace)
    return child_row(tmp_path, "m", 32, 300, 1, 400.0)


def test_a_runtime_that_hangs_is_its_cell_and_the_row_is_kept(tmp_path):
    trace = (
        "Timeout (0:05:00)!\nThread 0x1 (most recent call first):\n"
        '  File "/x/site-packages/ai_edge_litert/interpreter.py", line 7 in invoke\n'
    )
    row = _stopped_child(tmp_path, trace)
    assert row.ok and row.runtimes["openvino"]["ok"]
    assert row.runtimes["litert"] == {
        "ok": False,
        "reason": "did not finish in 300 s (stuck in ai_edge_litert/interpreter.py:invoke)",
    }


def test_a_runtime_that_crashes_the_process_is_its_cell(tmp_path):
    row = _stopped_child(tmp_path, "")
    assert row.ok and row.runtimes["litert"]["reason"] == "the process died (exit code 1)"


def test_the_table_has_a_column_per_runtime_and_says_why_one_failed():
    ok = {"ok": True, "reason": None, "relative": 4e-7, "agreement": 1.0}
    refused = {"ok": False, "reason": "the converter refuses aten.fft_rfft2"}
    rows = [
        Conformance("timm:a", [3, 32, 32], passed=list(STEPS), runtimes={"openvino": ok, "litert": ok}),
        Conformance("timm:b", [3, 32, 32], passed=list(STEPS), runtimes={"openvino": ok, "litert": refused}),
        Conformance("timm:c", [3, 32, 32], passed=["create"], failed_step="forward", reason="NaN"),
    ]
    text = to_markdown(rows, 32, 0.3, {"cpu": "x"}, "effvision zoo compat", ["openvino", "litert"])
    assert "openvino: 2 of 2; litert: 1 of 2" in text  # of the models whose pruned model runs
    assert "| top-1 agree | openvino | litert | result |" in text
    line = {row.split(" |")[0]: row for row in text.splitlines() if row.startswith("| ")}
    assert "| ok 4e-07 | FAIL | pass |" in line["| b"]
    assert "| - | - | FAIL |" in line["| c"]  # its pruned model never ran
    assert "- b, litert: the converter refuses aten.fft_rfft2" in text
