"""What every field of report.json means: the one description of the report's schema. The docs
site's reference page is generated from it, and a test checks that every field a real run writes is
described here. Fields may be added; none of these may be renamed or dropped."""

from __future__ import annotations

REPORT_INTRO = (
    "Every pipeline run writes `report.json` in its run folder after its last stage (from the stages' "
    "`metrics.json`, `dataset.json` and `env.json`); `effvision report RUN_DIR` rewrites it. Fields may "
    "be added; none below may be renamed or dropped. `stages[]` is one row per stage, in order."
)

# (section, what it covers, [(field path, meaning)])
REPORT_FIELDS: list[tuple[str, str, list[tuple[str, str]]]] = [
    (
        "Top level",
        "Where the run came from, its data, its files and the machine.",
        [
            ("recipe", "the recipe file the run was started from (null when the recipe was built in Python)"),
            ("run_dir", "the run folder, as it was given"),
            ("dataset", "the run's dataset.json without its list of bad files (null when the run has none)"),
            ("dataset.name", "the dataset card"),
            ("dataset.modality", "`image`, `video` or `points`"),
            ("dataset.train_size", "samples in the training split the run used (after `max_train_samples`)"),
            ("dataset.val_size", "samples in the validation split the run used (after `max_val_samples`)"),
            ("dataset.num_classes", "classes"),
            ("dataset.bad_samples", "unreadable files skipped"),
            ("dataset.sampler", "video and points: the frame or point sampler"),
            ("dataset.frames_per_clip", "video: frames per clip"),
            ("dataset.source_points_per_sample", "points: mean points per file"),
            ("dataset.source_bytes_per_sample", "points: mean bytes per file"),
            ("dataset.points_per_sample", "points: what the sampler keeps"),
            ("dataset.bytes_per_sample", "points: bytes of what the sampler keeps"),
            (
                "dataset.decision",
                "the decision split: training samples held out at load time (`data.holdout`, before selection and "
                "`max_train_samples`), never trained on; every choice of the run is scored on it and nothing "
                "else, the validation split being read only for the figures (null: none held out)",
            ),
            ("dataset.decision.n", "samples held out"),
            ("dataset.decision.of", "the whole training split's size"),
            ("dataset.decision.seed", "`data.holdout_seed`: the draw is fixed by it, not by the run's seed"),
            ("dataset.decision.stratified", "drawn per class"),
            (
                "dataset.decision.sha256",
                "of the held-out indices: the same slice is recognised (a zoo card records it)",
            ),
            (
                "dataset.decision.starting_model",
                "whether the starting zoo card has seen these images: it held out this slice, another one, or "
                "none (trained on the whole training split: decisions are then optimistic)",
            ),
            (
                "decision",
                "the shipped file's top-1 on the decision split, what a search chooses trials by (null: no split)",
            ),
            ("decision.stage", "the stage whose file ships"),
            ("decision.top1", "its top-1 on the decision split, in its runtime"),
            ("decision.reference_top1", "the uncompressed model's there, as an fp32 file of the same runtime"),
            ("decision.split", "the split, as dataset.decision describes it"),
            ("stages", "one row per stage, in order (the sections below)"),
            ("artifacts", "the last file of each kind the stages wrote, relative to the run folder"),
            ("artifacts.checkpoint", "a `model.pt`"),
            ("artifacts.onnx", "an ONNX file"),
            ("artifacts.pte", "an ExecuTorch file"),
            ("artifacts.openvino", "an OpenVINO IR (`.xml`, its weights in the `.bin` beside it)"),
            ("artifacts.tflite", "a LiteRT file (`.tflite`)"),
            ("artifacts.selection", "a select stage's `selection.json`"),
            (
                "env",
                "the machine and versions; env.json in the run folder holds more (platform, threads, command line)",
            ),
            ("env.torch", "torch version"),
            ("env.torchvision", "torchvision version"),
            ("env.timm", "timm version"),
            ("env.onnx", "onnx version"),
            ("env.onnxruntime", "onnxruntime version"),
            ("env.torch_pruning", "torch-pruning version"),
            ("env.python", "Python version"),
            ("env.cpu", "the CPU's name"),
            ("env.cpu_count", "its cores"),
            ("env.gpu", "the GPU's name (null without one)"),
            ("env.git_sha", "the git commit of the code that ran"),
        ],
    ),
    (
        "Every stage row",
        "Written for every stage, whatever its type.",
        [
            ("stages[].name", "the stage's `name:`, else its type"),
            ("stages[].type", "the stage type"),
            ("stages[].stage_dir", "its folder under `stages/`"),
            (
                "stages[].params",
                "parameters of the stage's model (for export, quantize, evaluate and bench: of the model the "
                "shipped file was made from)",
            ),
            ("stages[].macs", "multiply-accumulates per sample of that model"),
            ("stages[].size_bytes", "size on disk of the stage's artifact (`model.pt`, the `.onnx` or `.pte` file)"),
            ("stages[].accuracy", "top-1 on the validation split, 0..1, of this stage's artifact (null for `select`)"),
            ("stages[].evaluated_with", "what computed `accuracy`: `torch`, `onnxruntime` or `executorch`"),
            (
                "stages[].latency_ms",
                "from the run's bench stage, this artifact at the smallest benchmarked batch: `backend`, `batch`, "
                "`p50`, `p90`, `p99` in milliseconds; null when no bench stage measured it",
            ),
            ("stages[].throughput", "the same at the largest benchmarked batch: `backend`, `batch`, `samples_per_s`"),
            ("stages[].wall_s", "the stage's wall-clock seconds"),
            (
                "stages[].batchnorm",
                "stages that distil (prune's fine-tuning): after each distillation, whether the batch-norm "
                "statistics it ended with or recomputed ones were kept (`kept`), the top-1 of each (`trained`, "
                "`recomputed`) on held-out training images (`scored_on`), and `after` (which distillation)",
            ),
            (
                "stages[].input_size",
                "the input shape the stage's model takes (lower than the data's after a plan stage kept a lower size)",
            ),
            (
                "stages[].time_to_accuracy_s",
                "training seconds (evaluation and compilation excluded) until validation top-1 first reached the "
                "stage's `target_accuracy`; null when the stage does not train, has no target, or did not reach it",
            ),
        ],
    ),
    (
        "Training rows (`train`, `distill`, `qat`)",
        "Stages that train add how the training went. `train_s` and `time_to_accuracy_s` count training "
        "seconds across an interruption (the epoch cut short counts nothing).",
        [
            ("stages[].target_accuracy", "the top-1 the stage stops at (null: none)"),
            ("stages[].epochs_to_accuracy", "epochs until `target_accuracy` was reached"),
            ("stages[].stopped", "`target`, `time limit` or null (every epoch ran)"),
            ("stages[].train_s", "training seconds"),
            ("stages[].eval_s", "evaluation seconds"),
            ("stages[].compile_s", "compilation seconds"),
            ("stages[].checkpoint_s", "seconds writing epoch checkpoints, counted in none of the others"),
            (
                "stages[].resumed_from_epoch",
                "the epochs an epoch checkpoint had finished when this run took the stage over; null when it "
                "trained from the start",
            ),
            ("stages[].processes", "training processes (several with distributed data parallel)"),
            ("stages[].data", "how training read its data: `path` (e.g. batched, in memory) and `train_samples_per_s`"),
            ("stages[].accuracy_tta", "top-1 with test-time augmentation (with `tta_flip`)"),
            ("stages[].tta_flip", "whether test-time augmentation flipped the images"),
            ("stages[].max_param_difference_across_ranks", "with several processes: the largest parameter difference"),
            ("stages[].teacher", "`distill`, `qat`: the teacher it learned from"),
        ],
    ),
    (
        "`select` rows",
        "What a select stage kept of the training split.",
        [
            ("stages[].selector", "the selector"),
            ("stages[].budget", "the fraction (or count) asked for"),
            ("stages[].selected", "samples kept"),
            ("stages[].of", "samples it chose from"),
            ("stages[].weighted", "whether the kept samples carry weights"),
            ("stages[].per_class", "samples kept per class: `min`, `max`"),
            ("stages[].proxy_train_s", "seconds training the proxy model that scored the samples"),
            ("stages[].scoring_s", "seconds scoring"),
            ("stages[].select_s", "seconds selecting"),
            ("stages[].proxy_accuracy", "the proxy model's top-1"),
        ],
    ),
    (
        "`plan` rows",
        "The levers a plan stage measured on the uncompressed model and what it kept (also the report's `plan`).",
        [
            (
                "stages[].plan",
                "the plan: `goal_speedup`, `goal` (as it reads: a speed-up, a latency, the fastest file within the "
                "floor), `max_drop`, `backend`, `batch`, `scored_on` (the decision split), "
                "`reference` (`size`, `p50_ms`, `top1`), `levers` (each `lever`, `precision`, `size`, `p50_ms`, "
                "`speedup`, `top1`, `cost`, `file`; the kept one `kept: true`), `kept`, `why`, `remainder` (the "
                "speed-up left to pruning; 1: none), `prune`, `int8` (how the one int8 maker made the lever: its "
                "`tool`, `shipped`, `decision`, `float_nodes`, `speed_groups`, `accuracy_search`), `method`, "
                "`calibration`, `score_samples`, `timed`",
            ),
        ],
    ),
    (
        "`prune` rows",
        "What pruning did besides the common fields.",
        [
            ("stages[].epochs_between_steps", "epochs of distillation run between iterative pruning steps"),
            ("stages[].target", "aiming at a target: the target block the stage aimed at"),
            (
                "stages[].aim",
                "aiming at a target: the search's record: `target_ms`, `start` and `final` (`ms`, `speedup`), "
                "`steps`, the chosen `widths` per layer group, `groups`, `channel_multiple`, `narrowest`, "
                "`latency_model`; after a plan stage also `precision` (what candidates were timed as), `remainder` "
                "and `floor` (top-1 and drop on the plan's decision images, `held`); `met_by_plan` when the plan's "
                "levers met the target and nothing was pruned",
            ),
            (
                "stages[].finetune_features",
                "feature distillation's record (layers matched, loss weights); null without",
            ),
        ],
    ),
    (
        "`export` rows",
        "The exported file and how closely it follows the PyTorch model.",
        [
            ("stages[].format", "`onnx` or `pte`"),
            ("stages[].precision", "`fp32` or `int8`"),
            (
                "stages[].parity",
                "max/mean logit difference, `logit_scale` (the largest logit of the PyTorch model), "
                "`relative_diff` (max difference over that scale) and top-1 agreement with the PyTorch model",
            ),
        ],
    ),
    (
        "`quantize` and `qat` rows",
        "Int8 and the measured decisions behind the shipped file.",
        [
            ("stages[].calibration", "the calibration set: its `selector`, `n`, `pool`, `options` (`qat`: `samples`)"),
            ("stages[].method", "the calibration method"),
            ("stages[].reduce_range", "whether 7-bit weights were used"),
            ("stages[].backend", "`qat`: the runtime the int8 file was checked in"),
            (
                "stages[].tool",
                "`quantize`: the runtime's own int8 tool (ONNX Runtime's quantize_static with effvision's node "
                "search; NNCF and the LiteRT tools, which quantize the whole graph)",
            ),
            ("stages[].fp32_onnx_bytes", "size of the fp32 ONNX file"),
            ("stages[].fp32_bytes", "`quantize`: size of the fp32 file entering it (with the files beside it)"),
            (
                "stages[].decided_on",
                "`quantize`: the data its accuracy decisions (the floor, node reverts, int8 or fp32) were scored on: "
                "the decision split",
            ),
            ("stages[].int8_onnx_bytes", "`qat`: size of the int8 ONNX file"),
            ("stages[].shipped", "`int8`, or `fp32` when int8 did not pay or could not keep its accuracy"),
            ("stages[].decision", "the one line that says why"),
            (
                "stages[].decided_at",
                "`batches` the speed decisions were measured at and `why`: the batch the model ships at, the "
                "recipe's `target.batch`, else 1",
            ),
            ("stages[].int8_layers", "ONNX node names of the layers quantized"),
            ("stages[].float_layers", "ONNX node names of the layers with weights left in float"),
            ("stages[].float_nodes", "the other nodes left in float"),
            (
                "stages[].speed_groups",
                "per group tried (stem conv, depthwise convs, classifier, element-wise and pooling): `layers`, "
                "`p50_ms_int8` and `p50_ms_float` by batch, `decision` `int8` or `float`",
            ),
            (
                "stages[].speed_check",
                "`backend`, `batches`, `p50_ms` of `fp32` and `int8` by batch, timed interleaved, `int8_slower_at`",
            ),
            (
                "stages[].accuracy_search",
                "with `max_drop`: `fp32_accuracy`, `int8_accuracy` (every layer int8), `ranking` (per quantized "
                "node: `layer`, `op`, `sensitivity`, `decision` `reverted` or `kept`), `steps` (`reverted`, "
                "`accuracy`, `drop`, each on the whole validation split in ONNX Runtime) and `met`; on an IR or "
                "a LiteRT file `fp32_accuracy`, `int8_accuracy`, `max_drop`, `measured_from`, `met`, in that runtime",
            ),
        ],
    ),
    (
        "`evaluate` rows",
        "Test-time views of video (clips x crops).",
        [
            ("stages[].artifact_of", "`evaluate`, `bench`: the stage whose artifact it measured"),
            ("stages[].clips", "clips per video"),
            ("stages[].crops", "crops per clip"),
            ("stages[].views", "clips x crops"),
            ("stages[].macs_per_video", "multiply-accumulates per video over every view"),
            ("stages[].frames_decoded_per_video", "frames decoded per video"),
            ("stages[].frames_decoded_per_clip", "frames decoded per clip"),
            ("stages[].ms_per_video", "milliseconds per video"),
        ],
    ),
    (
        "`bench` rows",
        "Every timing of the run. The row's size and accuracy are those of the shipped stage (`artifact_of`: the "
        "last exported one, else the last model).",
        [
            (
                "stages[].roofline",
                "`device`, `copy_bytes_per_s`; per precision the ceiling `matmul_flops_per_s`, where it came from "
                "`matmul_probe` (`theoretical`: the CPU's instruction set, CPUs and clock; else the probe that "
                "measured it, `torch` or `onnxruntime`) and `peak_how` (how it was computed or measured)",
            ),
            ("stages[].plots", "file names of the plots in its folder"),
            (
                "stages[].all_measurements",
                "one row per artifact, backend, precision and batch: `stage`, `backend`, `precision`, `device`, "
                "`batch`, `p50`, `p90`, `p99`, `samples_per_s`, `repeats`, `warmup`, `first_call_ms`, `timer` "
                "(`perf_counter` or `cuda-event`), `peak_memory` (`kind`, `bytes`, `scope`), and when MACs are "
                "known `flops_per_sample`, `achieved_flops_per_s`, `peak_flops_per_s`, `peak_precision`, "
                "`peak_probe` (`theoretical` or the probe), `fraction_of_peak` (at most 1; null with "
                "`peak_exceeded: true` where a model beat a probe)",
            ),
        ],
    ),
    (
        "The reference, the headline and the target",
        "`reference` and `headline` are written by every run whose bench stage has `reference: true` (the "
        "default) and whose recipe compresses (a `prune`, `distill` or `quantize` stage); otherwise null. "
        "`target` is written when the recipe has a `target:` block (null otherwise).",
        [
            (
                "reference",
                "the uncompressed model, exported like the final artifact and timed interleaved with it",
            ),
            ("reference.what", "what it is, e.g. `uncompressed model, fp32 ONNX`"),
            ("reference.stage", "the model it was made from, e.g. `input of prune`"),
            ("reference.backend", "the runtime that ran it (the final artifact's)"),
            ("reference.accuracy", "its top-1 on the same validation split, in that runtime"),
            ("reference.size_bytes", "its file size"),
            ("reference.latency_ms", "as in a stage row"),
            ("reference.throughput", "as in a stage row"),
            ("reference.timed", "how it was timed: interleaved, round by round, with the final artifact"),
            ("headline", "the final artifact against the reference on its backend and smallest benchmarked batch"),
            ("headline.speedup", "reference p50 / final p50"),
            ("headline.size_ratio", "final size / reference size"),
            ("headline.accuracy_delta", "final top-1 - reference top-1"),
            ("headline.backend", "the backend both were timed on"),
            ("headline.batch", "the batch of `speedup`"),
            ("headline.speedups", "the speed-up at every benchmarked batch"),
            ("headline.final", "the shipped stage's name"),
            ("headline.final_p50_ms", "the final artifact's p50 by batch"),
            ("headline.reference_p50_ms", "the reference's p50 by batch"),
            (
                "plan",
                "the last plan stage's record (as its row's `plan`): which levers were measured, what each gave and "
                "cost, and what was kept; null without a plan stage",
            ),
            ("target", "what was asked and whether it was met"),
            ("target.backend", "the runtime of the target"),
            ("target.batch", "its batch"),
            ("target.speedup", "the speed-up asked for (or `latency_ms`)"),
            ("target.latency_ms", "the p50 in milliseconds asked for (instead of `speedup`)"),
            ("target.max_drop", "the largest accepted top-1 loss"),
            (
                "target.measured_by",
                "what the verdict rests on: the bench stage (the shipped artifact against the reference, "
                "interleaved), else the aiming stage's own last measurement",
            ),
            ("target.measured_speedup", "the speed-up measured at the target's backend and batch"),
            ("target.measured_ms", "the p50 measured there, in milliseconds"),
            ("target.accuracy_delta", "final top-1 - reference top-1 (null when only the aiming stage measured)"),
            (
                "target.met",
                "whether the final artifact reached the speed while losing at most `max_drop` (null: not measured)",
            ),
        ],
    ),
]


def documented_paths() -> set[str]:
    return {path for _, _, fields in REPORT_FIELDS for path, _ in fields}


# Top-level blocks that repeat a stage row's field: their keys are named, in backticks, in that
# field's one line.
MIRRORS = {"plan": "stages[].plan"}


def undescribed(report: dict) -> list[str]:
    """The field paths a report holds that REPORT_FIELDS does not describe (a new field needs a line here)."""
    missing = report_paths(report) - documented_paths()
    lines = {path: text for _, _, fields in REPORT_FIELDS for path, text in fields}
    for key, field in MIRRORS.items():
        block = report.get(key) or {}
        missing |= {f"{key}.{k}" for k in block if f"`{k}`" not in lines[field]}
    return sorted(missing)


def report_paths(report: dict) -> set[str]:
    """The field paths a report holds, as REPORT_FIELDS names them: top-level keys and those of its
    blocks (a mirrored block's keys: undescribed), and every stage row's keys (`stages[].accuracy`)."""
    found = set()
    for key, value in report.items():
        found.add(key)
        if key in MIRRORS:
            continue
        if key == "stages":
            found |= {f"stages[].{k}" for row in value for k in row}
        elif isinstance(value, dict):
            found |= {f"{key}.{k}" for k in value}
    return found
