"""The docs: generated pages are current, every link of the README and the docs
resolves (files and anchors), the README stays a front door, and every results
file renders. ``make docs`` (mkdocs build --strict) checks the site itself."""

from __future__ import annotations

import importlib.util
import json
import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(
    [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "charts" / "README.md"]
    + list(DOCS.rglob("*.md"))
)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def gen_docs():
    spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "scripts" / "gen_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_pages_are_current():
    stale = [
        rel
        for rel, content in gen_docs().generated().items()
        if not (ROOT / rel).is_file() or (ROOT / rel).read_text() != content
    ]
    assert stale == [], f"stale generated docs, run `make docs-gen`: {stale}"


def slug(heading: str) -> str:
    """Python-Markdown's toc slug (what mkdocs names a heading's anchor)."""
    text = re.sub(r"[`*]", "", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(path: Path) -> set[str]:
    body = FENCE.sub("", path.read_text())
    return {slug(m[1]) for m in re.finditer(r"^#{1,6} (.+?)\s*#*$", body, re.M)}


def links(path: Path) -> list[str]:
    body = FENCE.sub("", path.read_text())
    body = re.sub(r"`[^`\n]*`", "", body)  # code spans hold no links
    return LINK.findall(body)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves(page):
    bad = []
    for target in links(page):
        if re.match(r"[a-z]+:", target):  # http(s), mailto: not fetched here
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert bad == [], bad


def test_the_link_check_sees_a_broken_link(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n[ok](#title) [gone](missing.md) `[code](x.md)`\n")
    assert links(page) == ["#title", "missing.md"]
    assert slug("The seeds' studies on our `data`") == "the-seeds-studies-on-our-data"


def test_readme_is_a_front_door():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    for needed in ("make run", "make test", "gnn-faas up", "curl", "tritonclient",
                   "gnn-faas status", "gnn-faas replay", "helm install"):  # fmt: skip
        assert needed in readme, needed


def test_every_docs_page_is_in_the_site_nav():
    import yaml

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())

    def pages(nav):
        for entry in nav:
            value = next(iter(entry.values())) if isinstance(entry, dict) else entry
            yield from pages(value) if isinstance(value, list) else [value]

    assert set(pages(config["nav"])) == {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}


@pytest.mark.parametrize("path", sorted((DOCS / "results").glob("*.json")), ids=lambda p: p.stem)
def test_results_files_render_with_their_command(path):
    doc = json.loads(path.read_text())
    assert doc["command"].startswith(("gnn-faas", "AWS_", "nice", "python")), doc["command"]
    table = gen_docs().render_table(doc).splitlines()
    assert len(table) == len(doc["rows"]) + 2
    assert all(line.count(" | ") == len(doc["columns"]) - 1 for line in table[2:])
