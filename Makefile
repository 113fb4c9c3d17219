# Quickstart: `make demo` (installs into .venv, runs compress/default.yaml) and `make test`.
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
export HF_HUB_OFFLINE := 1
# This machine's pip config names local indexes that may be absent; their warnings are noise.
PIP_FILTER := grep -v "^WARNING: Location '" || true

.PHONY: install litert-converter demo lint format docs readme-check test test-each test-all zoo-compat bench bench-video bench-points bench-data bench-speed bench-cpu bench-int8 bench-qat bench-latency bench-pareto gpu-bench gpu-speedrun gpu-data gpu-wheels gpu-rehearse sysdeps clean help

help:
	@echo "make demo   - install into $(VENV) (if needed) and run the default pipeline on embedded data"
	@echo "make test   - install into $(VENV) (if needed), check formatting and lint, run the test suite"
	@echo "make lint   - ruff (formatting and lint, configured in pyproject.toml) and the house rules (tests/contract.py: no import cycles, imports down the layers, short functions and files)"
	@echo "make format - ruff: rewrite files to the house format and apply safe lint fixes"
	@echo "make docs   - build the documentation site into site/ (strict: a warning fails it); make test runs it"
	@echo "make readme-check - run every README.md command in order on a fresh clone of HEAD (21 min on 2 cores)"
	@echo "make test-each - each test file alone, in the suite's order (make test's time and a start-up per file)"
	@echo "make test-all - every test: the zoo-wide conformance sweep and the slow ones too"
	@echo "make litert-converter - LiteRT's converter (litert-torch) in .venv-litert, for --format litert (its pins clash with .venv's)"
	@echo "make bench  - slow tests and the CIFAR-10 pipeline on ../shared/datasets"
	@echo "make bench-video - video loader speed and memory, the video demo and its single-frame twin (BENCHMARKS.md)"
	@echo "make bench-points - point-cloud loader and FPS speed, and the point-cloud demo (BENCHMARKS.md)"
	@echo "make bench-data  - data efficiency studies: CIFAR-10 selection and compression, digits calibration sets (BENCHMARKS.md)"
	@echo "make bench-speed - time to 80% on CIFAR-10: the speed recipe against its plain preset, 2 seeds (BENCHMARKS.md), about 55 min on 2 cores"
	@echo "make bench-cpu   - the CPU deployment benchmark (BENCHMARKS.md), about 30 min on 2 cores"
	@echo "make bench-int8  - int8 that pays and keeps its accuracy: the four demo recipes, ResNet-18 at 224 px, two PTQ-lossy zoo nets (BENCHMARKS.md), about 60 min"
	@echo "make bench-latency - the latency model's prediction against measurement on three architectures (BENCHMARKS.md), about 5 min"
	@echo "make bench-pareto  - compress to 1.5x and 2x on CIFAR-10, latency-aware against uniform pruning (BENCHMARKS.md), about 30 min"
	@echo "make bench-qat   - quantization-aware training of the two PTQ-lossy zoo nets on the digits, and the point and video demos, QAT file vs fp32 file in ONNX Runtime (BENCHMARKS.md), about 60 min"
	@echo "make gpu-bench   - on a GPU machine: the GPU deployment suite, 330 s budget, results in \$$OUT (BENCHMARKS.md, GPU plan)"
	@echo "make gpu-speedrun - on a GPU machine: the speed recipe's h200 preset to 94%, 3 seeds, 220 s budget"
	@echo "make gpu-data    - xz the CIFAR-10 zips from ../shared/datasets into .data/cifar10-xz (about 19 MiB) for the speed run"
	@echo "make gpu-wheels  - fetch the cp312 wheels both GPU commands install on a machine without a package registry"
	@echo "make gpu-rehearse - rehearse both GPU commands on the CPU, as that machine imports, against the fetched wheels"

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "installing effvision and its pinned dependencies into $(VENV) ..."
	@$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[test,edge,openvino,litert,pretrained,search,docs]' 2>&1 | $(PIP_FILTER)
	@$(BIN)/python -c "import effvision, torch, onnxruntime, torch_pruning, timm" 
	@touch $(STAMP)

# The one install step every command relies on: the Python packages, then the system libraries.
install: $(STAMP) sysdeps

# System libraries some readers need (libusb for open3d): installed when we are root
# with apt-get; otherwise the tests that need them skip and say what to install. (No grep -q: under
# pipefail its early exit fails ldconfig with SIGPIPE, and the library looked missing every time.)
sysdeps:
	@if ! ldconfig -p 2>/dev/null | grep libusb-1.0 >/dev/null; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing the system library libusb-1.0-0 (open3d's point-cloud readers need it) ..."; \
	    (apt-get update -qq && apt-get install -y -qq libusb-1.0-0 >/dev/null) || echo "note: could not install libusb-1.0-0: point-cloud commands will say so"; \
	  else echo "note: libusb-1.0-0 is missing and this is not root with apt-get: run 'sudo apt-get install libusb-1.0-0' for point clouds"; fi; \
	fi

# LiteRT's converter (litert-torch) in an environment of its own, .venv-litert: its pins clash
# with effvision's (xdsl pins typing-extensions < 4.13, pydantic needs >= 4.14). A .pth file puts
# .venv's packages last on its path, so torch is shared (not installed twice, 0.9 GB instead of
# 6.6 GB) while its own pins come first. `effvision export --format litert` runs it as a child.
LITERT_VENV := .venv-litert
litert-converter: install
	@test -x $(LITERT_VENV)/bin/python || $(PYTHON) -m venv $(LITERT_VENV)
	@$(LITERT_VENV)/bin/python -c "import pathlib, sys, sysconfig; pathlib.Path(sysconfig.get_paths()['purelib'], 'effvision-project.pth').write_text(sys.argv[1] + '\\n')" "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
	@echo "installing litert-torch into $(LITERT_VENV) (about a minute) ..."
	@$(LITERT_VENV)/bin/python -m pip install -q --disable-pip-version-check litert-torch==0.10.0 2>&1 | grep -v "^WARNING: Location '\|dependency resolver\|requires .* but you have" || true
	@$(LITERT_VENV)/bin/python -c "import litert_torch" 2>/dev/null && echo "the LiteRT converter is ready: effvision export --format litert"

demo: install
	$(BIN)/effvision compress compress/default.yaml --run-dir runs/demo

# ruff holds the style (pyproject.toml [tool.ruff]); `make test` runs this first, so CI fails on a finding.
lint: install
	$(BIN)/ruff format --check --diff .
	$(BIN)/ruff check .
	$(BIN)/python tests/contract.py effvision

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# The documentation site; its reference pages are generated from the code (docs/hooks/reference.py).
# Strict: a broken link, a link to a renamed recipe key's anchor or any other warning fails it (not with
# --quiet, which hides the warnings from the strict count too).
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

# Every command README.md shows, run in order on a fresh clone of HEAD (tests/readme_commands.py).
README_CHECK_DIR ?= /tmp/effvision-readme-check
readme-check:
	rm -rf $(README_CHECK_DIR) && git clone -q . $(README_CHECK_DIR)
	@test ! -d ../shared || ln -sfn $(abspath ../shared) $(dir $(README_CHECK_DIR))shared
	cd $(README_CHECK_DIR) && $(PYTHON) tests/readme_commands.py --run

test: install lint docs
	EFFVISION_QUIET=1 $(BIN)/python -m pytest -m "not slow and not zoo" --durations=30

# Each test file alone, in the order the suite collects them (a test that passes only after
# another one set something up fails here); the files that failed are listed at the end.
test-each: install
	@failed=""; for f in $$(EFFVISION_QUIET=1 $(BIN)/python -m pytest -m "not slow and not zoo" --collect-only -q 2>/dev/null | grep -E '^tests/.*: [0-9]+$$' | cut -d: -f1); do \
		echo "== $$f"; EFFVISION_QUIET=1 $(BIN)/python -m pytest -m "not slow and not zoo" -q -p no:cacheprovider $$f || failed="$$failed $$f"; \
	done; if [ -n "$$failed" ]; then echo "failed alone:$$failed"; exit 1; fi; echo "every file passed alone"

# Everything: the conformance sweep over every card and architecture (marker zoo) and the slow
# tests (those that read ../shared skip without it).
test-all: install lint
	EFFVISION_QUIET=1 $(BIN)/python -m pytest --durations=20

# docs/compat.md: timm's efficient families through prune, export and int8, then as each installed
# runtime's fp32 file (about 2 hours on 2 cores; --runtimes none: under one).
zoo-compat: install
	HF_HUB_OFFLINE=1 EFFVISION_QUIET=1 $(BIN)/effvision zoo compat

bench: install
	EFFVISION_QUIET=1 $(BIN)/python -m pytest -m slow
	$(BIN)/effvision compress compress/cifar10.yaml --set data.root=../shared/datasets --run-dir runs/cifar10

# Video: the loader (sampled decoding vs decode-everything) on the real clips, its memory over
# 2,000 clip reads per backend (real and generated clips; exits 1 past 50 MB of growth, about
# 17 min), the video demo and its single-frame twin (BENCHMARKS.md).
bench-video: install
	$(BIN)/python -m effvision.studies.video_loader_bench ../shared/testdata/videos --frames 8 --size 112 --rounds 5 --json runs/video-loader.json
	$(BIN)/python -m effvision.studies.video_loader_bench ../shared/testdata/videos --frames 8 --size 112 --memory 2000 --backends decord,pyav,auto --dataset synthetic-motion --json runs/video-memory.json
	$(BIN)/effvision compress compress/video-default.yaml --run-dir runs/video-default
	$(BIN)/effvision train compress/video-default.yaml --set data.num_frames=1 --run-dir runs/video-single-frame

# Points: the loader (read, normalise, FPS by open3d) on the real clouds, the torch FPS loop that
# PointNet++ runs inside the network against open3d's, side by side, and the generated shapes'
# cached training loader; then the point-cloud demo (BENCHMARKS.md).
bench-points: install
	$(BIN)/python -m effvision.studies.point_loader_bench ../shared/testdata/pointclouds --points 1024 --rounds 3 --dataset synthetic-shapes --json runs/point-loader.json
	$(BIN)/effvision compress compress/points-default.yaml --run-dir runs/points-default

# Data efficiency (BENCHMARKS.md): image training data per sample against batched, coreset
# selection on CIFAR-10 (the cheap default proxy, then the expensive one, at budget 0.5; then the
# whole sweep), the training split compressed at several levels, and calibration sets of the
# digits demo.
bench-data: install
	$(BIN)/python -m effvision.studies.image_loader_bench compress/cifar10.yaml --set data.root=../shared/datasets --rounds 2 --json runs/image-loader.json
	$(BIN)/effvision study selection compress/cifar10-selection.yaml --set data.root=../shared/datasets --seeds 3 --budgets 0.5 \
	  --methods random,forgetting:keep=easy,el2n:keep=easy --out runs/study-selection-cheap
	$(BIN)/effvision study selection compress/cifar10-selection.yaml --set data.root=../shared/datasets --seeds 3 --budgets 0.5 \
	  --set stages.0.proxy.width=1 --set stages.0.proxy.scores=pass --set stages.0.proxy.progressive_sizes=null \
	  --set stages.0.proxy.channels_last=true --methods random,forgetting:keep=easy,el2n:keep=easy --out runs/study-selection-expensive
	$(BIN)/effvision study selection compress/cifar10-selection.yaml --set data.root=../shared/datasets --seeds 3 --out runs/study-selection-cifar10
	$(BIN)/effvision study selection compress/cifar10-selection.yaml --set data.root=../shared/datasets --seeds 3 --out runs/study-selection-cifar10 \
	  --methods random,el2n,forgetting,kcenter,gradient_clusters,el2n:keep=easy,forgetting:keep=easy
	$(BIN)/effvision study data-compression compress/cifar10-selection.yaml --set data.root=../shared/datasets --set data.max_train_samples=20000 \
	  --seeds 3 --out runs/study-data-compression-cifar10 \
	  --levels format=webp+quality=75,format=webp+quality=50,original,quality=95,quality=75,quality=50,quality=30,size=24+quality=95,size=16+quality=95
	$(BIN)/effvision compress compress/default.yaml --run-dir runs/demo
	$(BIN)/effvision study calibration runs/demo --selectors random,class_balanced,kcenter,herding --n 256 --seeds 5
	$(BIN)/effvision study calibration runs/demo --selectors random,class_balanced,kcenter,herding --n 256 --seeds 5 \
	  --method percentile --out runs/demo/study-calibration-percentile

# Time-to-accuracy (BENCHMARKS.md): the speed recipe and its plain preset, side by side, seed by
# seed; a plain run stops at 4x the recipe's time.
bench-speed: install
	$(BIN)/effvision study speed compress/cifar10-speedrun.yaml --set data.root=../shared/datasets --target-accuracy 0.80 \
	  --seeds 2 --cap 4 --out runs/study-speed-cifar10

# The CPU deployment table. Trained weights come from compress/resnet18_cifar10.yaml (run first
# when missing); the shared real images calibrate int8 and check every export's agreement.
R18_RUN := runs/resnet18_cifar10
bench-cpu: install
	@test -f $(R18_RUN)/stages/2-finetune/model.pt || $(BIN)/effvision train compress/resnet18_cifar10.yaml --set data.root=../shared/datasets --run-dir $(R18_RUN)
	EFFVISION_QUIET=1 $(BIN)/python -m effvision.studies.deploy_suite cpu --out runs/bench-cpu --images ../shared/testdata/images/cifar10_test \
	  --weights resnet18=$(R18_RUN)/stages/2-finetune/model.pt

# Int8 that pays and keeps its accuracy (BENCHMARKS.md): every demo recipe with its reference row and
# headline, ResNet-18 at 224 px (where int8 pays), and accuracy-aware int8 on two zoo nets that
# plain post-training int8 costs more than a point.
bench-int8: install
	$(BIN)/effvision compress compress/default.yaml --run-dir runs/int8-demo
	$(BIN)/effvision compress compress/points-default.yaml --run-dir runs/int8-points
	$(BIN)/effvision compress compress/video-default.yaml --run-dir runs/int8-video
	$(BIN)/effvision compress compress/cifar10.yaml --set data.root=../shared/datasets --run-dir runs/int8-cifar10
	$(BIN)/effvision compress compress/resnet18-int8-224.yaml --set data.root=../shared/datasets --run-dir runs/int8-resnet18-224
	$(BIN)/effvision compress compress/int8-accuracy.yaml --run-dir runs/int8-accuracy-mobilenetv3
	$(BIN)/effvision compress compress/int8-accuracy.yaml --set model.name=repvit_m0_9 --run-dir runs/int8-accuracy-repvit

# The latency model's prediction against measurement (ONNX Runtime CPU, batch 1, 32x32): plans for
# 80/60/45% of each network's latency and uniform prunes, all timed interleaved (about 5 min).
bench-latency: install
	HF_HUB_OFFLINE=1 EFFVISION_QUIET=1 $(BIN)/python -m effvision.compression.latency_bench cifar_resnet20 speednet timm:mobilenetv3_small_050 \
	  --cache-dir runs/cache/latency-bench --json runs/latency-model.json

# Compress to a target on CIFAR-10 (BENCHMARKS.md): the zoo's speednet at 1.5x and 2x, latency-aware
# against uniform pruning at matched measured latency, timed side by side (about 30 min).
bench-pareto: install
	HF_HUB_OFFLINE=1 $(BIN)/effvision study pareto compress/target-cifar10.yaml --targets 1.5,2 \
	  --set data.root=../shared/datasets --out runs/study-pareto-cifar10

bench-qat: install
	$(BIN)/effvision compress compress/qat-digits.yaml --run-dir runs/qat-mobilenetv3
	$(BIN)/effvision compress compress/qat-digits.yaml --set model.name=repvit_m0_9 --set stages.qat.epochs=12 --run-dir runs/qat-repvit
	$(BIN)/effvision compress compress/qat-points.yaml --run-dir runs/qat-points
	$(BIN)/effvision compress compress/qat-video.yaml --run-dir runs/qat-video

# The GPU plan (BENCHMARKS.md, "GPU plan"): two commands for a lent machine with one CUDA GPU, its
# own python3 and no package registry. effvision/gpu_plan.py holds what each needs and carries, a
# preflight (milliseconds) that names anything missing, and the budgets; the suite writes its
# table after every cell and stops cleanly on SIGTERM or at its budget. Here: `make gpu-wheels`
# and `make gpu-data` once, `make gpu-rehearse` to rehearse both commands on the CPU.
GPU_PYTHON ?= python3
gpu-bench:
	$(GPU_PYTHON) -m effvision.gpu_plan bench $(if $(OUT),--out $(OUT))

gpu-speedrun:
	$(GPU_PYTHON) -m effvision.gpu_plan speed $(if $(OUT),--out $(OUT))

# The CIFAR-10 zips, xz-compressed to about 19 MiB so that they travel with the tree (64 MiB at most).
GPU_DATA_SRC ?= ../shared/datasets
gpu-data: install
	$(BIN)/python -m effvision.gpu_plan pack-data $(GPU_DATA_SRC)

# cp312 wheels of what the GPU machine lacks (the list and pins: effvision/gpu_plan.py WHEELS).
gpu-wheels: install
	rm -rf .whl && mkdir -p .whl
	$(BIN)/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
	  $$($(BIN)/python -m effvision.gpu_plan wheels) 2>&1 | $(PIP_FILTER)
	@ls .whl

# The rehearsal of both commands on the CPU, in a Python that imports like the GPU machine's,
# against the fetched wheels too (`make test` runs it without them).
gpu-rehearse: gpu-wheels
	HF_HUB_OFFLINE=1 EFFVISION_QUIET=1 $(BIN)/python -m pytest tests/test_gpu_plan.py

clean:
	rm -rf runs .pytest_cache
