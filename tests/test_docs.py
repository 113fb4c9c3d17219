"""The docs point at things that exist: every relative link in the project's Markdown files (and
its #anchor, when it names a heading) and every repository path README.md names in backticks
resolve inside the repository, so a renamed or deleted file breaks a test rather than a reader."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# docs/ is checked by the site's strict build (make docs), which resolves its generated pages and anchors too
LINKED_DOCS = ["README.md", "CONTRIBUTING.md", "BENCHMARKS.md"]

# Paths README.md names that a checkout does not hold, each with the reason. Keep it short: a
# path that should exist does not belong here.
NOT_IN_CHECKOUT = {
    "runs/": "run folders, written by the commands (git-ignored)",
    ".venv/": "the virtual environment make demo and make test create (git-ignored)",
    "site/": "the documentation site make docs builds (git-ignored)",
}

FENCE = re.compile(r"^(```|~~~)")
INLINE_CODE = re.compile(r"`[^`\n]+`")
LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
PLACEHOLDER = re.compile(r"[<>|{}]|\.\.\.")


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks: commands in them are examples, not links."""
    out, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line.strip()):
            fenced = not fenced
        elif not fenced:
            out.append((number, line))
    return out


def links(text: str) -> list[tuple[int, str]]:
    return [(n, m.group(1)) for n, line in prose_lines(text) for m in LINK.finditer(INLINE_CODE.sub("", line))]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces become hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found = set()
    for _, line in prose_lines(path.read_text()):
        m = HEADING.match(line)
        if m:
            base = slug(m.group(1))
            name, k = base, 1
            while name in found:  # repeated headings get -1, -2, ...
                name, k = f"{base}-{k}", k + 1
            found.add(name)
    return found


def broken_links(doc: Path, text: str) -> list[str]:
    problems = []
    for number, target in links(text):
        if SCHEME.match(target):  # http(s), mailto: outside the repository
            continue
        path, _, anchor = target.partition("#")
        resolved = (doc.parent / path).resolve() if path else doc
        where = f"{doc.relative_to(ROOT)}:{number}: ({target})"
        if not resolved.is_relative_to(ROOT):
            problems.append(f"{where} leaves the repository")
        elif not resolved.exists():
            problems.append(f"{where} does not exist")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            problems.append(f"{where} names no heading of {resolved.relative_to(ROOT)}")
    return problems


def named_paths(text: str) -> list[tuple[int, str]]:
    """Backticked single words that look like repository paths: they hold a slash, or are a
    top-level file such as BENCHMARKS.md, Makefile or pyproject.toml; and top-level documents
    named in plain prose ("see BENCHMARKS.md")."""
    found = []
    for number, line in prose_lines(text):
        prose = INLINE_CODE.sub("", LINK.sub("", line))
        found += [(number, m.group(1)) for m in re.finditer(r"(?<![\w/.-])([A-Z][A-Z_]*\.md)\b", prose)]
        for m in INLINE_CODE.finditer(line):
            word = m.group(0).strip("`")
            if re.search(r"\s|=|:", word) or word.startswith("-"):
                continue  # a command, an option, a key=value or a name:with-scheme
            if "/" in word or re.fullmatch(r"[A-Z][A-Z_]*\.md|Makefile|pyproject\.toml", word):
                found.append((number, word))
    return found


def not_in_checkout(word: str) -> bool:
    return any(word == key.rstrip("/") or word.startswith(key.rstrip("/") + "/") for key in NOT_IN_CHECKOUT)


def missing_paths(text: str) -> list[str]:
    problems = []
    for number, word in named_paths(text):
        if PLACEHOLDER.search(word) or not_in_checkout(word):
            continue  # <root>/train|val/... describes a layout; see NOT_IN_CHECKOUT for the rest
        if "*" in word:
            ok = any(ROOT.glob(word))
        else:
            path = ROOT / word
            ok = path.is_dir() if word.endswith("/") else path.exists()
        if not ok:
            problems.append(f"README.md:{number}: `{word}` is not in the repository")
    return problems


@pytest.mark.parametrize("name", LINKED_DOCS)
def test_every_relative_link_resolves(name):
    doc = ROOT / name
    text = doc.read_text()
    assert links(text), f"{name} has no links: is the pattern still right?"
    problems = broken_links(doc, text)
    assert not problems, "\n".join(problems)


def test_every_path_the_readme_names_exists():
    text = (ROOT / "README.md").read_text()
    assert len(named_paths(text)) >= 3
    problems = missing_paths(text)
    assert not problems, "\n".join(problems)


def test_every_exception_is_still_needed():
    words = [w for _, w in named_paths((ROOT / "README.md").read_text())]
    unused = [key for key in NOT_IN_CHECKOUT if not any(not_in_checkout(w) and w.startswith(key) for w in words)]
    assert not unused, f"README.md no longer names these; drop them from NOT_IN_CHECKOUT: {unused}"


def test_a_broken_link_and_a_missing_path_are_caught():
    doc = ROOT / "README.md"
    text = (
        "See [the design](docs/no-such-page.md), [a heading](#no-such-heading), [up](../outside.md),\n"
        "[fine](docs/design.md#reportjson), [web](https://example.org/x) and `compress/no-such.yaml`;\n"
        "`runs/demo/report.md`, `<root>/train/<class>` and `compress/*.yaml` are fine; DESIGN.md is not.\n"
        "```\n[in a code block](nowhere.md) `nowhere/at/all.py`\n```\n"
    )
    problems = broken_links(doc, text)
    assert [p.split(" (")[1].split(")")[0] for p in problems] == [
        "docs/no-such-page.md",
        "#no-such-heading",
        "../outside.md",
    ], problems
    assert missing_paths(text) == [
        "README.md:2: `compress/no-such.yaml` is not in the repository",
        "README.md:3: `DESIGN.md` is not in the repository",
    ]
