"""The HTML report's page: sections of facts, schemas and figures rendered into one self-contained file.

Pure text building (no matplotlib, no file access): :func:`render_page` turns
:class:`Section` values into HTML. A Content-Security-Policy of ``default-src 'none'``
(inline styles and ``data:`` images only) makes the browser refuse any fetch the page
might attempt; the figures are inline SVG.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from html import escape

from pipelines.io.summary import Balance

__all__ = ["Figure", "Section", "balance_lines", "render_page"]

_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
_STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 0 auto; max-width: 1100px; padding: 1em 2em; color: #222; }
h1 { font-size: 1.5em; margin-bottom: .2em; } h2 { border-bottom: 1px solid #ccc; margin-top: 2em; }
nav a { margin-right: 1em; } table { border-collapse: collapse; margin: .5em 0 1em; }
td, th { border: 1px solid #ddd; padding: 2px 8px; text-align: left; vertical-align: top; }
th { background: #f4f4f4; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.figures { display: flex; flex-wrap: wrap; gap: 1em; } figure { margin: 0; max-width: 100%; }
figure svg { max-width: 100%; height: auto; } figcaption { color: #555; font-size: .9em; }
.ok { color: #1a7f37; } .bad { color: #b42318; font-weight: bold; } .note { color: #555; }
"""


@dataclass(frozen=True)
class Figure:
    """One chart: ``svg`` is inline SVG text (or ``None`` with ``empty`` saying why nothing is drawn)."""

    id: str
    caption: str
    svg: str | None = None
    empty: str = ""


@dataclass(frozen=True)
class Section:
    """One dataset of the snapshot: its facts, its schema and its figures."""

    id: str
    title: str
    facts: Sequence[tuple[str, str]] = ()
    schema: Sequence[tuple[str, str, bool]] = ()
    figures: Sequence[Figure] = ()
    notes: Sequence[str] = field(default_factory=tuple)


def balance_lines(summary: Mapping[str, object], balances: Sequence[Balance]) -> list[tuple[str, bool]]:
    """For each balance whose total ``summary`` holds: its equation with the values, and whether it holds."""
    lines = []
    for b in balances:
        if b.total not in summary or (b.unless and summary.get(b.unless)):
            continue
        parts = {p: int(summary.get(p, 0)) for p in b.parts}  # type: ignore[call-overload]
        total = int(summary[b.total])  # type: ignore[call-overload]
        equation = f"{b.total} {total} = " + " + ".join(f"{p} {n}" for p, n in parts.items())
        lines.append((f"{b.name} balance: {equation}", total == sum(parts.values())))
    return lines


def _table(rows: Sequence[Sequence[str]], header: Sequence[str] | None = None) -> str:
    head = "<tr>" + "".join(f"<th>{escape(h)}</th>" for h in header) + "</tr>" if header else ""
    body = "".join("<tr>" + "".join(f"<td{_num(c)}>{escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table>{head}{body}</table>"


def _num(cell: str) -> str:
    return ' class="num"' if cell.replace(",", "").replace(".", "", 1).lstrip("-").isdigit() else ""


def _figure(f: Figure) -> str:
    body = f.svg if f.svg else f'<p class="note">{escape(f.empty or "nothing to draw")}</p>'
    return f'<figure id="{escape(f.id)}">{body}<figcaption>{escape(f.caption)}</figcaption></figure>'


def _section(s: Section) -> str:
    parts = [f'<section id="{escape(s.id)}"><h2>{escape(s.title)}</h2>']
    parts += [f'<p class="note">{escape(n)}</p>' for n in s.notes]
    if s.facts:
        parts.append(_table([(k, v) for k, v in s.facts]))
    if s.figures:
        parts.append('<div class="figures">' + "".join(_figure(f) for f in s.figures) + "</div>")
    if s.schema:
        rows = [(name, kind, "yes" if nullable else "no") for name, kind, nullable in s.schema]
        parts.append("<details><summary>schema</summary>" + _table(rows, ("column", "type", "nullable")) + "</details>")
    parts.append("</section>")
    return "".join(parts)


def _summary(summary: Mapping[str, object] | None, balances: Sequence[tuple[str, bool]]) -> str:
    if summary is None:
        return ""
    rows = [(k, v if isinstance(v, str) else json.dumps(v)) for k, v in summary.items()]
    checks = "".join(
        f'<p class="{"ok" if ok else "bad"}">{"holds" if ok else "BROKEN"}: {escape(text)}</p>' for text, ok in balances
    )
    return f'<section id="summary"><h2>summary.json</h2>{checks}{_table(rows, ("counter", "value"))}</section>'


def render_page(
    title: str,
    sections: Sequence[Section],
    summary: Mapping[str, object] | None = None,
    balances: Sequence[tuple[str, bool]] = (),
    notes: Sequence[str] = (),
) -> str:
    """The whole report as one HTML document (UTF-8, no external reference)."""
    links = ([("summary", "summary")] if summary is not None else []) + [(s.id, s.title) for s in sections]
    nav = "<nav>" + "".join(f'<a href="#{escape(i)}">{escape(t)}</a>' for i, t in links) + "</nav>"
    body = "".join(f'<p class="note">{escape(n)}</p>' for n in notes)
    body += _summary(summary, balances) + "".join(_section(s) for s in sections)
    return (
        "<!DOCTYPE html>\n"
        f'<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<link rel="icon" href="data:,">'
        f"<title>{escape(title)}</title><style>{_STYLE}</style></head>"
        f"<body><h1>{escape(title)}</h1>{nav}{body}</body></html>\n"
    )
