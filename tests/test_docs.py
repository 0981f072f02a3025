"""The docs stay in step with the code: the generated pages are what the generator
writes now, and every relative link leads to a file and heading that exist."""

from __future__ import annotations

import functools
import importlib.util
import re

import pytest

from docs_blocks import REPO, all_blocks, doc_files, where

REGENERATE = "python docs/generate.py"
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")


def _generator():
    spec = importlib.util.spec_from_file_location("docs_generate", REPO / "docs" / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_docs_are_current():
    generator = _generator()
    files = generator.generated_files()
    stale = [
        path.relative_to(REPO).as_posix()
        for path, text in files.items()
        if not path.exists() or path.read_text(encoding="utf-8") != text
    ]
    stale += [f"{path.relative_to(REPO).as_posix()} (no rule has this page)" for path in generator.stale_files(files)]
    assert not stale, f"generated docs are stale: run `{REGENERATE}`, then commit: {', '.join(stale)}"


def test_every_rule_has_a_page_in_the_index():
    generator = _generator()
    index = (REPO / "docs" / "rules" / "README.md").read_text(encoding="utf-8")
    for rule in generator._rules():
        assert f"]({generator.rule_page_name(rule)})" in index, f"{rule.code} is missing from docs/rules/README.md"


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|<[^>]+>", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@functools.lru_cache(maxsize=None)
def _prose(path) -> str:
    """The page with its code blocks blanked (a `# comment` there is no heading, `[i](j)` no link)."""
    text = path.read_text(encoding="utf-8")
    for block in all_blocks():
        if block.path == path:
            text = text.replace(block.text, "\n" * block.text.count("\n"), 1)
    return text


def _anchors(path) -> set[str]:
    text = _prose(path)
    anchors, seen = set(), {}
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.M):
        slug = _slug(heading)
        anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


@pytest.mark.parametrize("page", doc_files(), ids=lambda page: page.relative_to(REPO).as_posix())
def test_relative_links_resolve(page):
    text = _prose(page)
    for match in LINK.finditer(text):
        target = match.group(1) or match.group(2)
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        file_part, _, anchor = target.partition("#")
        linked = (page.parent / file_part).resolve() if file_part else page
        line = text[: match.start()].count("\n") + 1
        assert linked.exists(), f"{where(page, line)}: {target} does not exist"
        if anchor and linked.suffix == ".md":
            assert anchor in _anchors(linked), f"{where(page, line)}: {linked.name} has no heading #{anchor}"
