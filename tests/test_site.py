"""The documentation site's references come from the code: a recipe key renamed in a copy of the
package changes the generated recipe reference, and the strict build of that copy fails where a
guide still links to the old key. (`make docs`, run by `make test`, builds the real site.)"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MKDOCS = Path(sys.executable).parent / "mkdocs"
PRUNE_RATIO = '    ratio: float = Field(0.5, gt=0, lt=1, description="fraction of channels removed per prunable layer")'


def reference_module():
    spec = importlib.util.spec_from_file_location("site_reference", ROOT / "docs" / "hooks" / "reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_references_cover_the_code():
    import effvision.stages  # noqa: F401
    from effvision.registry import STAGES

    ref = reference_module()
    recipe, cli = ref.recipe_reference(), ref.cli_reference()
    for kind in STAGES.names():
        for key in STAGES.get(kind).config.model_fields:
            if key not in ("type", "name"):
                assert f'id="{kind}-{key}"' in recipe, f"{kind}.{key} is missing from the recipe reference"
    for anchor in ("data-root", "model-pretrained", "target-speedup", "recipe-seed", "prune-finetune-epochs"):
        assert f'id="{anchor}"' in recipe
    for anchor in ("effvision-compress-set", "effvision-search-show-retime", "effvision-data-prepare"):
        assert f'id="{anchor}"' in cli or f"{{#{anchor}}}" in cli
    rows = [line for line in recipe.splitlines() if line.startswith("| <a id=")]
    undescribed = [row.split('"')[1] for row in rows if row.rstrip().endswith("|  |")]
    assert len(rows) > 200 and not undescribed, f"recipe keys without a description: {undescribed}"
    report = ref.report_reference()
    assert 'id="report-headline-speedup"' in report and 'id="report-stages-accuracy"' in report


@pytest.fixture(scope="module")
def renamed_copy(tmp_path_factory):
    """A copy of the package, docs and site config with the prune stage's `ratio` renamed."""
    copy = tmp_path_factory.mktemp("renamed")
    ignore = shutil.ignore_patterns("__pycache__")
    for name in ("effvision", "docs"):
        shutil.copytree(ROOT / name, copy / name, ignore=ignore)
    for name in ("mkdocs.yml", "BENCHMARKS.md", "tests/contract.py"):  # (the architecture page reads the contract)
        (copy / name).parent.mkdir(exist_ok=True)
        shutil.copy(ROOT / name, copy / name)
    stages = copy / "effvision" / "compression" / "stages.py"
    source = stages.read_text()
    assert source.count(PRUNE_RATIO) == 1, "the prune stage's ratio moved: update PRUNE_RATIO"
    stages.write_text(source.replace(PRUNE_RATIO, PRUNE_RATIO.replace("ratio:", "keep_ratio:", 1)))
    return copy


def run_in(copy: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(copy), "HF_HUB_OFFLINE": "1"}
    return subprocess.run(args, cwd=copy, env=env, capture_output=True, text=True, timeout=600)


def test_a_renamed_recipe_key_changes_the_reference(renamed_copy):
    script = (
        "import effvision, importlib.util as u\n"
        "s = u.spec_from_file_location('r', 'docs/hooks/reference.py'); m = u.module_from_spec(s)\n"
        "s.loader.exec_module(m); print(effvision.__file__); print(m.recipe_reference())\n"
    )
    done = run_in(renamed_copy, sys.executable, "-c", script)
    assert done.returncode == 0, done.stderr[-2000:]
    where, _, reference = done.stdout.partition("\n")
    assert where.startswith(str(renamed_copy)), f"the copy's package was not the one imported: {where}"
    assert 'id="prune-keep_ratio"' in reference and 'id="prune-ratio"' not in reference
    assert 'id="prune-ratio"' in reference_module().recipe_reference()  # and the real one still has it


def test_the_build_fails_where_a_guide_names_the_old_key(renamed_copy):
    guides = "\n".join(p.read_text() for p in (ROOT / "docs").rglob("*.md"))
    assert "reference/recipe.md#prune-ratio" in guides, "no guide links to prune.ratio: pick a linked key"
    done = run_in(renamed_copy, str(MKDOCS), "build", "--strict", "--site-dir", str(renamed_copy / "site"))
    assert done.returncode != 0
    assert "prune-ratio" in done.stdout + done.stderr


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
PAGES = {
    "reference/recipe/": ['id="prune-ratio"', 'id="data-root"', "Recipe reference"],
    "reference/cli/": ['id="effvision-search-show"', 'id="effvision-compress-set"'],
    "reference/report/": ['id="report-headline-speedup"'],
    "guides/points/": ["Point clouds"],
    "": ["effvision"],
}


@pytest.fixture(scope="module")
def served_site(tmp_path_factory):
    """The real site, built (strict) and served over HTTP on the loopback, as a reader opens it."""
    import functools
    import http.server
    import threading

    site = tmp_path_factory.mktemp("site")
    done = run_in(ROOT, str(MKDOCS), "build", "--strict", "--site-dir", str(site))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium here (apt-get install chromium)")
@pytest.mark.parametrize("page", PAGES)
def test_the_pages_render_in_headless_chromium(served_site, page, tmp_path):
    # --dump-dom prints the page after its scripts ran: the theme's navigation and the generated tables
    command = [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run"]
    command += [f"--user-data-dir={tmp_path}", "--dump-dom", served_site + page]
    dom = subprocess.run(command, capture_output=True, text=True, timeout=120).stdout
    assert 'class="md-nav' in dom, f"{page}: the theme did not render"
    for text in PAGES[page]:
        assert text in dom, f"{page}: {text} not rendered"


def test_every_effvision_command_in_the_guides_parses():
    # the guides' command lines go through the CLI's own parser, as README's do (tests/test_readme.py):
    # a renamed option breaks this test, not the reader; lines with placeholders (<x>, ..., [a|b]) are forms
    import shlex

    from readme_commands import parse_cli, readme_commands

    checked, problems = 0, []
    for page in sorted((ROOT / "docs").rglob("*.md")):
        for kind, line in readme_commands(page.read_text()):
            words = shlex.split(re.split(r"\s(?:>|\||&&)\s", line)[0]) if kind == "bash" else []
            if not words or words[0] not in ("effvision", ".venv/bin/effvision"):
                continue
            if any(mark in w for w in words for mark in ("<", "...", "|", "[")):
                continue
            checked += 1
            try:
                parse_cli(words[1:])
            except Exception as e:  # typer's own click raises its UsageError
                problems.append(f"{page.relative_to(ROOT)}: {line}: {e}")
    assert checked > 30 and not problems, "\n".join(problems)
