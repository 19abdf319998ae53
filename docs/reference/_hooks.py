"""MkDocs hooks for the docs site (mkdocs.yml ``hooks``).

The home page is the README: ``docs/index.md`` holds the snippet line that includes it,
and this hook replaces that line with the README's text, its links into ``docs/`` made
relative to the docs folder (so ``mkdocs build --strict`` checks them) and its links to
other files of the repository pointed at the repository (``repo_url``), so the quick start
is written once.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
INCLUDE = '--8<-- "README.md"'
_LINK = re.compile(r"\]\((?!https?:|mailto:|#)([^)\s]+)\)")


def readme_for_site(repo_url: str) -> str:
    """The README as the site's home page shows it: a link to ``docs/X`` becomes ``X``,
    a link to another file of the repository ``{repo_url}/blob/main/...``."""

    def link(m: re.Match[str]) -> str:
        target = m.group(1)
        if target.startswith("docs/"):
            return f"]({target.removeprefix('docs/')})"
        return f"]({repo_url.rstrip('/')}/blob/main/{target})"

    return _LINK.sub(link, (ROOT / "README.md").read_text(encoding="utf-8"))


def on_page_markdown(markdown: str, *, page: Any, config: Any, **kwargs: Any) -> str:
    """Puts the README in place of the include line of ``index.md``."""
    if page.file.src_uri == "index.md":
        return markdown.replace(INCLUDE, readme_for_site(config["repo_url"]))
    return markdown
