"""MkDocs hooks for the docs site (mkdocs.yml ``hooks``).

The home page is the README: ``docs/index.md`` holds the snippet line that includes it,
and this hook replaces that line with the README's text, its links into ``docs/`` made
relative to the docs folder, so the quick start is written once and every link is checked
by ``mkdocs build --strict``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
INCLUDE = '--8<-- "README.md"'
_DOCS_LINK = re.compile(r"\]\(docs/")


def readme_for_site() -> str:
    """The README as the site's home page shows it: links to ``docs/X`` become ``X``."""
    return _DOCS_LINK.sub("](", (ROOT / "README.md").read_text(encoding="utf-8"))


def on_page_markdown(markdown: str, *, page: Any, **kwargs: Any) -> str:
    """Puts the README in place of the include line of ``index.md``."""
    if page.file.src_uri == "index.md":
        return markdown.replace(INCLUDE, readme_for_site())
    return markdown
