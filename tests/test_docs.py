"""The front door and the manual: README.md stays short and points at pages that exist, the
manual under docs/ builds as a site with `mkdocs build --strict` (a broken link or anchor, a
page missing from the nav or a nav entry without a page fails it - shown on a copy with one of
each), the README's Python is the API page's (which tests/test_live_audio.py runs), and every
`personaplex-edge` command line the README and the manual show parses with the CLI as it is."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from personaplex_edge.cli import parse_args

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MAX_README_LINES = 250


def _mkdocs(config: Path, site: Path) -> subprocess.CompletedProcess:
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")  # mkdocs-material, the theme
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f",
                           str(config), "-d", str(site)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


def _links(markdown: str) -> list[str]:
    """The relative targets of a page's markdown links and images (code blocks left out)."""
    prose = re.sub(r"```.*?```", "", markdown, flags=re.S)
    return [t for t in re.findall(r"\]\(([^)\s]+)\)", prose)
            if not re.match(r"[a-z]+:", t)]


def _blocks(markdown: str, language: str) -> list[str]:
    return [b.split("```", 1)[0] for b in markdown.split(f"```{language}\n")[1:]]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    site = tmp_path_factory.mktemp("site")
    built = _mkdocs(ROOT / "mkdocs.yml", site)
    assert built.returncode == 0, built.stderr[-3000:]
    return site


def test_the_manual_builds_strictly_with_every_page(site):
    pages = sorted(p.stem for p in DOCS.glob("*.md"))
    for page in pages:
        html = site / ("index.html" if page == "index" else f"{page}/index.html")
        assert html.is_file(), page
    assert (site / "serve.png").is_file()  # the page's picture, the README's too


def test_a_broken_link_or_a_page_outside_the_nav_fails_the_build(tmp_path):
    shutil.copytree(DOCS, tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    index = tmp_path / "docs" / "index.md"
    index.write_text(index.read_text() + "\n[gone](no-such-page.md), [cli](cli.md#no-anchor)\n")
    (tmp_path / "docs" / "stray.md").write_text("# Not in the nav\n")
    built = _mkdocs(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert built.returncode != 0
    for named in ("no-such-page.md", "#no-anchor", "stray.md"):
        assert named in built.stderr, named


def test_the_readme_is_short_and_its_links_resolve(site):
    text = README.read_text()
    assert len(text.splitlines()) <= MAX_README_LINES
    targets = _links(text)
    assert {"docs/install.md", "docs/cli.md", "docs/python-api.md", "docs/serve.md",
            "docs/realtime.md", "docs/models.md", "docs/measured.md"} <= set(targets)
    for target in targets:
        path, _, anchor = target.partition("#")
        assert (ROOT / path).exists(), target
        if anchor:  # an anchor of a page of the manual: an id in its built page
            page = Path(path).relative_to("docs").with_suffix("")
            html = (site / page / "index.html").read_text()
            assert f'id="{anchor}"' in html, target


def test_the_readme_python_is_a_block_of_the_api_page():
    """test_live_audio.py runs the API page's blocks as written; the README's is one of them."""
    readme = _blocks(README.read_text(), "python")
    assert readme and set(readme) <= set(_blocks((DOCS / "python-api.md").read_text(), "python"))


FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```", re.S | re.M)


def _command_lines(markdown: str) -> list[list[str]]:
    """The words after `personaplex-edge` of every command line in a fenced block of any kind
    (bash, console, yaml's list items, none), comments and continuations taken out."""
    out = []
    for fence in FENCE.finditer(markdown):
        for line in fence.group(2).replace("\\\n", " ").splitlines():
            line = line.split(" #", 1)[0].strip().removeprefix("$ ")
            if "personaplex-edge" not in line or line.startswith("#"):
                continue
            words = shlex.split(line)
            for i, word in enumerate(words):
                if word.endswith("personaplex-edge") and word != "personaplex-edge[serve]":
                    out.append(words[i + 1:])
                    break
    return out


def _is_synopsis(words: list[str]) -> bool:
    """A usage line ([optional] parts, A|B choices, `..` for a list) rather than a command."""
    return any(c in w for w in words for c in "[]|") or any(".." in w for w in words)


def _unknown_flags(words: list[str]) -> list[str]:
    """The flags of a usage line that its subcommand's parser does not have."""
    from personaplex_edge.cli import build_parser, with_subcommand

    words = with_subcommand(words)
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    known = {o for a in sub.choices[words[0]]._actions for o in a.option_strings}
    flags = re.findall(r"--[a-z][a-z0-9-]*", " ".join(words[1:]))
    return [f for f in flags if f not in known]


def _problems(pages: list[Path]) -> list[str]:
    found = []
    for page in pages:
        for words in _command_lines(page.read_text()):
            if _is_synopsis(words):
                found += [f"{page.name}: personaplex-edge {words[0]} has no {flag}"
                          for flag in _unknown_flags(words)]
                continue
            try:
                parse_args(words)
            except SystemExit:
                found.append(f"{page.name}: personaplex-edge {' '.join(words)} does not parse")
    return found


def test_every_documented_command_line_parses():
    """A command parses with the CLI as it is; a usage line's flags all exist."""
    pages = [README, *sorted(DOCS.glob("*.md"))]
    assert sum(len(_command_lines(p.read_text())) for p in pages) >= 30
    assert _problems(pages) == []


def test_a_command_line_in_any_fence_is_checked(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("```\npersonaplex-edge run --model demo --no-such-flag\n```\n"
                    "```yaml\nargs:\n  - personaplex-edge batch --model m --inptu d\n```\n"
                    "```console\n$ personaplex-edge devices\n```\n"
                    "```\npersonaplex-edge serve [--model DIR] [--prot 8998]\n```\n")
    assert _problems([page]) == [
        "page.md: personaplex-edge run --model demo --no-such-flag does not parse",
        "page.md: personaplex-edge batch --model m --inptu d does not parse",
        "page.md: personaplex-edge serve has no --prot"]
