"""docs/index.md is the site's table of contents: it lists every page of mkdocs.yml's nav."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]


class _NavLoader(yaml.SafeLoader):
    """mkdocs.yml names Python objects (`!!python/name:`) that only MkDocs resolves."""


_NavLoader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)


def nav_pages(nav: Any) -> list[str]:
    """The page files of a nav tree, in order."""
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [page for entry in nav for page in nav_pages(entry)]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in nav_pages(value)]
    return []


def pages_linked_from_the_index(text: str) -> list[str]:
    return re.findall(r"^\| \[[^\]]+\]\(([^)#]+\.md)\)", text, flags=re.MULTILINE)


def test_nav_pages_reads_nested_sections_in_order() -> None:
    nav = [{"Home": "index.md"}, {"Using": [{"A": "a.md"}, {"B": [{"C": "c.md"}]}]}, "d.md"]
    assert nav_pages(nav) == ["index.md", "a.md", "c.md", "d.md"]


def test_the_index_lists_every_nav_page_in_nav_order() -> None:
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=_NavLoader)
    pages = [page for page in nav_pages(config["nav"]) if page != "index.md"]
    assert len(pages) > 10
    listed = pages_linked_from_the_index((ROOT / "docs" / "index.md").read_text())
    missing = [page for page in pages if page not in listed]
    assert not missing, f"docs/index.md does not list {missing}"
    assert listed == pages, "docs/index.md lists the pages in mkdocs.yml's nav order"


def test_a_page_missing_from_the_index_is_caught() -> None:
    index = "| [A](a.md) | a |\n| [C](c.md) | c |\n"
    assert pages_linked_from_the_index(index) == ["a.md", "c.md"]
    assert "b.md" not in pages_linked_from_the_index(index)
