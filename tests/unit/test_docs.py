"""The README and the pages under docs/: every relative link lands on a file (and an
#anchor on a heading of it), the README stays a short front page that links every page,
and the code blocks marked runnable run.

A block is marked runnable by the line ``<!-- test: run -->`` right before its ```bash or
```python fence (indented like the fence inside a list item). Mark only blocks that take
a few seconds, need no server, broker, Spark session or model, and write only inside the
current folder: each runs in a fresh temporary folder, with this interpreter's folder (the
venv's ``bin``) first on ``PATH``; bash with ``bash -e``, python with this interpreter.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
PAGES = [README, *DOCS]
#: The README's hard limit: a front page read in five minutes; the reference is in docs/.
README_MAX_LINES = 250
MARKER = "<!-- test: run -->"
#: Seconds one marked block may take (they take well under one each).
BLOCK_TIMEOUT_S = 60

FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
#: ``[text](target)``; the text may hold code spans and line breaks, not brackets.
LINK = re.compile(r"\[([^\[\]]*)\]\(([^()\s]+)\)")


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO))


def _in_code(lines: list[str]) -> list[bool]:
    """For each line, whether it is part of a fenced code block (its fences included).
    A block closes on a line of the opening's character, at least as many, alone."""
    flags, fence = [], None
    for line in lines:
        m = FENCE.match(line)
        if fence is None:
            if m:
                fence = m.group(1)
            flags.append(bool(m))
        else:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) \
                    and not line.strip()[len(m.group(1)):].strip():
                fence = None
            flags.append(True)
    return flags


def _prose(text: str) -> str:
    """``text`` with its fenced code blocks blanked (line numbers kept)."""
    lines = text.splitlines()
    return "\n".join("" if code else line for line, code in zip(lines, _in_code(lines)))


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lowercase, punctuation dropped except ``-`` and
    ``_``, each space a ``-``.

    Example:
        >>> slug("Result channel `kafka`: one record per result, a topic per priority")
        'result-channel-kafka-one-record-per-result-a-topic-per-priority'
        >>> slug("L1 routing and L2 retrieval (`sts l1`, `sts kb`)")
        'l1-routing-and-l2-retrieval-sts-l1-sts-kb'
    """
    text = LINK.sub(r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of ``path``'s headings; a repeated one gets ``-1``, ``-2``, ... as on
    GitHub."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in _prose(path.read_text(encoding="utf-8")).splitlines():
        if m := re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line):
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(path: Path) -> list[tuple[int, str]]:
    """(line, target) of every markdown link outside code blocks."""
    text = _prose(path.read_text(encoding="utf-8"))
    return [(text.count("\n", 0, m.start()) + 1, m.group(2)) for m in LINK.finditer(text)]


def test_every_relative_link_lands_on_a_file_and_a_heading() -> None:
    wrong = []
    for page in PAGES:
        for line, target in links(page):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            where = f"{_rel(page)}:{line}: {target}"
            file_part, _, anchor = target.partition("#")
            dest = (page.parent / file_part).resolve() if file_part else page
            if REPO != dest and REPO not in dest.parents:
                wrong.append(f"{where} (outside the repository)")
            elif not dest.exists():
                wrong.append(f"{where} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                wrong.append(f"{where} (no heading #{anchor} in {_rel(dest)})")
    assert not wrong, "\n".join(wrong)


def test_the_link_check_sees_a_broken_anchor_and_a_missing_file(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n## Two writers\n\n[ok](#two-writers) [bad](#three-writers)\n"
                    "[gone](missing.md)\n````\n```\n# not a heading [in code](nowhere.md)\n"
                    "```\n````\n## Two writers\n", encoding="utf-8")
    assert anchors(page) == {"title", "two-writers", "two-writers-1"}
    assert links(page) == [(5, "#two-writers"), (5, "#three-writers"), (6, "missing.md")]


def test_the_readme_is_a_short_front_page() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines < README_MAX_LINES, f"README.md has {lines} lines; move detail into docs/"


def test_the_readme_links_every_docs_page() -> None:
    linked = {(README.parent / t.partition("#")[0]).resolve() for _, t in links(README)}
    missing = [_rel(p) for p in DOCS if p.resolve() not in linked]
    assert not missing, f"README.md does not link {missing}"


@pytest.mark.parametrize("page", DOCS, ids=[p.name for p in DOCS])
def test_every_docs_page_opens_with_a_summary_and_the_way_back(page: Path) -> None:
    """A title, then one line that says what the page holds and links the README."""
    lines = page.read_text(encoding="utf-8").splitlines()
    assert lines[0].startswith("# "), f"{page.name}: no title on the first line"
    first = next(line for line in lines[1:] if line.strip())
    assert "](../README.md" in first, f"{page.name}: the line after the title: {first!r}"


def runnable_blocks() -> list[tuple[str, str, str]]:
    """(id, language, code) of every block marked runnable in the README and docs/."""
    found = []
    for page in PAGES:
        lines = page.read_text(encoding="utf-8").splitlines()
        in_code = _in_code(lines)
        for i, line in enumerate(lines):
            if line.strip() != MARKER or in_code[i]:  # a marker shown inside an example
                continue
            where = f"{_rel(page)}:{i + 1}"
            fence = re.match(r"^(\s*)```(bash|python)\s*$", lines[i + 1] if i + 1 < len(lines)
                             else "")
            assert fence, f"{where}: {MARKER} must be right before a ```bash or ```python fence"
            indent, language = fence.group(1), fence.group(2)
            end = next((j for j in range(i + 2, len(lines))
                        if lines[j].strip() == "```"), None)
            assert end is not None, f"{where}: the marked block is not closed"
            code = "\n".join(line.removeprefix(indent) for line in lines[i + 2:end]) + "\n"
            found.append((where, language, code))
    return found


BLOCKS = runnable_blocks()


def test_runnable_blocks_are_marked() -> None:
    """The marker is spelled right somewhere (a renamed marker would run nothing)."""
    assert len(BLOCKS) >= 5, BLOCKS


@pytest.mark.parametrize(("language", "code"), [(lang, code) for _, lang, code in BLOCKS],
                         ids=[where for where, _, _ in BLOCKS])
def test_a_marked_block_runs(language: str, code: str, tmp_path: Path) -> None:
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("SPARK_REMOTE", None)
    if language == "bash":
        command = ["bash", "-e", "-c", "set -o pipefail\n" + code]
    else:
        (tmp_path / "block.py").write_text(code, encoding="utf-8")
        command = [sys.executable, "block.py"]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=BLOCK_TIMEOUT_S)
    assert done.returncode == 0, f"exit {done.returncode}\n{code}\n{done.stdout}{done.stderr}"
