"""The report's document: sections, tables and figures, written as HTML or Markdown.

:class:`Doc` collects what ``orcasim report`` builds (see :mod:`orcasim.experiments.report`)
and renders it twice: a self-contained HTML page with base64 PNGs, and Markdown with the
PNGs as files beside it.
"""

from __future__ import annotations

import base64
import html
import io
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure


@dataclass
class Doc:
    """A report as a list of blocks, rendered to HTML or Markdown."""

    title: str
    blocks: list[tuple[str, Any]] = field(default_factory=list)
    images: dict[str, bytes] = field(default_factory=dict)

    def h2(self, text: str) -> None:
        self.blocks.append(("h2", text))

    def p(self, text: str) -> None:
        self.blocks.append(("p", text))

    def items(self, lines: Sequence[str]) -> None:
        self.blocks.append(("ul", list(lines)))

    def table(self, df: pd.DataFrame) -> None:
        self.blocks.append(("table", df))

    def figure(self, name: str, fig: Figure, caption: str) -> None:
        import matplotlib.pyplot as plt

        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=100)
        plt.close(fig)
        self.images[name] = buf.getvalue()
        self.blocks.append(("img", (name, caption)))

    def html(self) -> str:
        out = [f"<!doctype html><html lang='en'><head><meta charset='utf-8'>"
               f"<title>{html.escape(self.title)}</title><style>{CSS}</style></head><body>",
               f"<h1>{html.escape(self.title)}</h1>"]
        for kind, x in self.blocks:
            if kind == "h2":
                out.append(f"<h2>{html.escape(x)}</h2>")
            elif kind == "p":
                out.append(f"<p>{_inline_html(x)}</p>")
            elif kind == "ul":
                out.append("<ul>" + "".join(
                    f"<li{' class=warn' if s.startswith('WARNING') else ''}>{_inline_html(s)}</li>"
                    for s in x) + "</ul>")
            elif kind == "table":
                out.append("<div class='tbl'>" + x.to_html(index=False, border=0, na_rep="-")
                           + "</div>")
            elif kind == "img":
                name, caption = x
                data = base64.b64encode(self.images[name]).decode()
                out.append(f"<figure><img alt='{html.escape(_alt(caption))}' "
                           f"src='data:image/png;base64,{data}'><figcaption>"
                           f"{_inline_html(caption)}</figcaption></figure>")
        out.append("</body></html>")
        return "\n".join(out)

    def markdown(self, image_dir: str) -> str:
        """The report as Markdown; every text is escaped (see :func:`_md_inline`), so user
        strings (scenario, variant and grid names and values) render as written."""
        out = [f"# {_md_inline(self.title)}", ""]
        for kind, x in self.blocks:
            if kind == "h2":
                out += [f"## {_md_inline(x)}", ""]
            elif kind == "p":
                out += [_md_inline(x), ""]
            elif kind == "ul":
                out += [f"- {_md_inline(s)}" for s in x] + [""]
            elif kind == "table":
                out += [_md_table(x), ""]
            elif kind == "img":
                name, caption = x
                text = _md_inline(caption)
                out += [f"![{_md_text(_alt(caption))}]({image_dir}/{name}.png)", "",
                        f"*{text}*", ""]
        return "\n".join(out)


CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;max-width:1100px;
margin:2em auto;padding:0 1.2em;color:#222;line-height:1.45}
h1{font-size:1.7em;border-bottom:2px solid #3b6ea5;padding-bottom:.3em}
h2{font-size:1.3em;margin-top:1.8em;color:#24476b}
code{background:#f2f4f7;padding:0 .25em;border-radius:3px;font-size:.92em}
.tbl{overflow-x:auto}
table{border-collapse:collapse;font-size:.82em;margin:.6em 0}
th,td{padding:.3em .7em;text-align:right;border-bottom:1px solid #e3e6ea;white-space:nowrap}
th{background:#f5f7fa;border-bottom:2px solid #cfd6de}
tr:hover td{background:#fafbfd}
figure{margin:1em 0}img{max-width:100%}
figcaption{font-size:.88em;color:#555}
li.warn,.warn{color:#a4471b}
"""


def _alt(caption: str) -> str:
    """A caption as image alt text: plain words, without Markdown code marks."""
    return caption.replace("`", "")


def _inline_html(text: str) -> str:
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))


#: characters with a meaning in Markdown (or HTML, which Markdown passes through) inline; an
#: underscore between two word characters is plain text (``throughput_tok_s``)
MD_SPECIAL = re.compile(r"([\\`*\[\]<>&|~]|(?<!\w)_|_(?!\w))")
#: what makes a line a heading, quote, list item or rule when it starts it
MD_LINE_START = re.compile(r"^(\s*)([-+=#]|\d+(?=[.)]))")


def _md_text(text: str, line_start: bool = True) -> str:
    """``text`` on one line with every Markdown- or HTML-significant character escaped
    (and, at a ``line_start``, what would make the line a heading or a list item)."""
    flat = MD_SPECIAL.sub(r"\\\1", re.sub(r"\s+", " ", str(text)))
    if not line_start:
        return flat
    m = MD_LINE_START.match(flat)
    if m is None:
        return flat
    lead, mark = m[1], m[2]
    escaped = f"{mark}\\" if mark[0].isdigit() else f"\\{mark}"
    return lead + escaped + flat[m.end():]


def _md_inline(text: str) -> str:
    """A report text as Markdown: its `code` spans kept as code, the rest escaped."""
    parts = re.split(r"`([^`]+)`", str(text))
    return "".join(f"`{part}`" if i % 2 else _md_text(part, line_start=i == 0)
                   for i, part in enumerate(parts))


def _md_table(df: pd.DataFrame) -> str:
    cols = [_md_text(str(c)) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in df.itertuples(index=False):
        cells = ["-" if _isnan(v) else _md_text(str(v)) for v in row]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _isnan(v: Any) -> bool:
    return isinstance(v, float) and v != v
