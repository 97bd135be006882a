"""Charts drawn with matplotlib (headless) and returned as inline SVG text for the HTML report.

The SVG is made fit to sit inside an HTML page that fetches nothing: no XML prolog or
DOCTYPE, no ``<metadata>`` block, no namespace declarations (the HTML parser puts
``<svg>`` and ``xlink:href`` in their namespaces itself), and text kept as text
(``svg.fonttype: none``), so the page holds no URL at all. Element ids are salted with
the figure's id, so two figures in one page never share an id.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from pipelines.optional import require

__all__ = ["bar_chart", "histogram", "scatter", "timeline"]

_NAMESPACES = re.compile(r'\s+xmlns(:\w+)?="[^"]*"')
_METADATA = re.compile(r"<metadata>.*?</metadata>\s*", re.DOTALL)
_WIDTH_IN = 5.2


@contextmanager
def _figure(salt: str, height_in: float = 3.6) -> Iterator[tuple[Any, Any]]:
    matplotlib = require("matplotlib", "plot", "inspect --html (matplotlib)")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": salt, "font.size": 9}):
        fig, ax = plt.subplots(figsize=(_WIDTH_IN, height_in))
        try:
            yield fig, ax
        finally:
            plt.close(fig)


def _svg(fig: Any) -> str:
    fig.tight_layout()
    out = io.StringIO()
    fig.savefig(out, format="svg", metadata={"Date": None})
    text = out.getvalue()
    text = text[text.index("<svg") :]
    return _NAMESPACES.sub("", _METADATA.sub("", text)).strip()


def bar_chart(figure_id: str, labels: Sequence[str], counts: Sequence[int], *, title: str, xlabel: str) -> str:
    """Horizontal bars, the first label on top."""
    with _figure(figure_id, height_in=max(1.6, 0.9 + 0.24 * len(labels))) as (fig, ax):
        ax.barh(list(labels)[::-1], list(counts)[::-1], color="#4c72b0")
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        return _svg(fig)


def histogram(figure_id: str, values: np.ndarray, *, title: str, xlabel: str, log: bool = False) -> str:
    """A histogram of ``values``; ``log`` uses log-spaced bins and log axes (heavy-tailed counts)."""
    with _figure(figure_id) as (fig, ax):
        if log:
            top = max(float(values.max()) if values.size else 1.0, 1.0)
            ax.hist(values, bins=np.logspace(0, np.log10(top + 1), 40), color="#4c72b0")
            ax.set_xscale("log")
            ax.set_yscale("log")
        else:
            ax.hist(values, bins=40, color="#4c72b0")
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("count")
        return _svg(fig)


def timeline(figure_id: str, starts_ms: np.ndarray, counts: np.ndarray, *, unit: str, title: str) -> str:
    """Counts per time bin (bin starts in ms since the epoch, UTC)."""
    with _figure(figure_id) as (fig, ax):
        when = starts_ms.astype("datetime64[ms]")
        ax.bar(when, counts, width=1.0 if unit == "day" else 1 / 24, align="edge", color="#4c72b0")
        ax.set_title(title)
        ax.set_ylabel(f"events per {unit}")
        fig.autofmt_xdate()
        return _svg(fig)


def scatter(figure_id: str, xy: np.ndarray, groups: dict[str, np.ndarray], *, title: str, labels: Sequence[str]) -> str:
    """Points of ``xy`` (N, 2), one colour per group (a boolean mask over the rows)."""
    with _figure(figure_id, height_in=4.4) as (fig, ax):
        for name, mask in groups.items():
            if mask.any():
                ax.scatter(xy[mask, 0], xy[mask, 1], s=6, alpha=0.6, label=f"{name} ({int(mask.sum())})")
        ax.set_title(title)
        ax.set_xlabel(labels[0])
        ax.set_ylabel(labels[1])
        if any(mask.any() for mask in groups.values()):
            ax.legend(loc="best", markerscale=2)
        return _svg(fig)
