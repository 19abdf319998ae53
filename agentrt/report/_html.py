"""The report as one self-contained HTML page: inline CSS, plots as base64 PNGs, no
scripts and no external resources, so it opens offline and can be mailed as one file."""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from dataclasses import dataclass

from ._tables import TextTable, html_table

__all__ = ["Folded", "Image", "html_page"]

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #222;
       margin: 24px auto; max-width: 1240px; padding: 0 16px; }
h1 { font-size: 22px; margin-bottom: 4px; }
h2 { font-size: 16px; margin: 28px 0 8px; }
.meta { color: #666; margin: 0 0 16px; }
table { border-collapse: collapse; margin: 4px 0; }
th, td { padding: 4px 10px; border-bottom: 1px solid #e4e4e4; white-space: nowrap; }
th { background: #f4f6f8; font-weight: 600; }
.num { text-align: right; font-variant-numeric: tabular-nums; }
.label { text-align: left; }
tbody tr:hover { background: #fafbfc; }
.caption { color: #666; font-size: 12px; max-width: 1000px; margin: 6px 0 0; }
.row { display: flex; flex-wrap: wrap; gap: 16px; }
figure { margin: 20px 0 0; flex: 1 1 560px; max-width: 100%; }
figure img { width: 100%; border: 1px solid #eee; }
figcaption { color: #666; font-size: 12px; }
details { margin: 24px 0 0; }
summary { cursor: pointer; font-weight: 600; }
"""


@dataclass(frozen=True)
class Image:
    """A PNG with its caption; narrow ones sit side by side."""

    caption: str
    png: bytes
    wide: bool = False


@dataclass(frozen=True)
class Folded:
    """Blocks shown only when the reader unfolds them (``<details>``, no script)."""

    summary: str
    blocks: Sequence[TextTable | Image]


def _figure(image: Image) -> str:
    data = base64.b64encode(image.png).decode("ascii")
    alt = html.escape(image.caption)
    return (
        f'<figure><img alt="{alt}" src="data:image/png;base64,{data}">'
        f"<figcaption>{alt}</figcaption></figure>"
    )


def html_page(title: str, meta: str, blocks: Sequence[TextTable | Image | Folded]) -> str:
    """A page of tables and images, in order, all inline; :class:`Folded` blocks closed."""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(title)}</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f'<p class="meta">{html.escape(meta)}</p>',
        *_blocks(blocks),
        "</body></html>\n",
    ]
    return "\n".join(parts)


def _blocks(blocks: Sequence[TextTable | Image | Folded]) -> list[str]:
    parts: list[str] = []
    row: list[str] = []
    for block in [*blocks, None]:
        if isinstance(block, Image) and not block.wide:
            row.append(_figure(block))
            continue
        if row:
            parts.append('<div class="row">' + "".join(row) + "</div>")
            row = []
        if isinstance(block, Image):
            parts.append(_figure(block))
        elif isinstance(block, TextTable):
            parts.append(html_table(block))
        elif isinstance(block, Folded):
            parts.append(f"<details><summary>{html.escape(block.summary)}</summary>")
            parts.extend(_blocks(block.blocks))
            parts.append("</details>")
    return parts
