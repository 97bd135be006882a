"""``inspect --html``: one self-contained HTML page about a snapshot (figures as inline SVG).

:func:`build_sections` turns the datasets found by :func:`~pipelines.inspect.report.find_datasets`
into page sections (facts, schema, figures); :func:`build_report` renders the whole page.
Figure ids are fixed (``fig-history-lengths``, ``fig-surfaces``, ``fig-event-types``,
``fig-timeline``, ``fig-dead-letters``, ``fig-embedding-norms``, ``fig-embedding-pca``,
suffixed ``-2``, ``-3`` when a path holds a kind twice) so that a reader or a test can find them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.inspect import report, svg
from pipelines.inspect.page import Figure, Section, balance_lines, render_page
from pipelines.io.summary import Balance

__all__ = ["FIGURES", "build_report", "build_sections"]

#: The figures each layout's section draws, by id.
FIGURES: dict[str, tuple[str, ...]] = {
    "history": ("fig-history-lengths", "fig-surfaces", "fig-event-types", "fig-timeline"),
    "dead_letter": ("fig-dead-letters",),
    "representation": ("fig-embedding-norms", "fig-embedding-pca"),
}


def _schema(table: pa.Table) -> list[tuple[str, str, bool]]:
    return [(f.name, str(f.type), f.nullable) for f in table.schema]


def _count(n: float) -> str:
    return f"{n:,.0f}"


def _history(d: report.Dataset, fid: Callable[[str], str]) -> tuple[list[tuple[str, str]], list[Figure]]:
    lengths = report.history_lengths(d.table)
    pct = report.percentiles(lengths)
    facts = [
        ("users", _count(d.table.num_rows)),
        ("events retained", _count(int(lengths.sum()))),
        ("events per user p50 / p90 / p99 / max", " / ".join(_count(pct[p]) for p in report.PERCENTILES)),
    ]
    mixes = report.history_event_mix(d.table)
    starts, counts, unit = report.event_timeline(report.history_event_times(d.table))
    figures = [
        Figure(
            fid("fig-history-lengths"),
            "retained events per user history (log bins)",
            svg.histogram(fid("fig-history-lengths"), lengths, title="history lengths", xlabel="events", log=True),
        ),
        *(
            Figure(
                fid(f"fig-{name.replace('_', '-')}s"),
                f"retained events by {name.replace('_', ' ')}",
                svg.bar_chart(
                    fid(f"fig-{name.replace('_', '-')}s"),
                    [m[0] for m in mix],
                    [m[1] for m in mix],
                    title=f"{name.replace('_', ' ')} mix",
                    xlabel="events",
                ),
            )
            for name, mix in mixes.items()
        ),
        Figure(
            fid("fig-timeline"),
            f"retained events per {unit} (event time, UTC)",
            svg.timeline(fid("fig-timeline"), starts, counts, unit=unit, title="timeline") if counts.size else None,
            empty="no events",
        ),
    ]
    return facts, figures


def _dead_letters(d: report.Dataset, fid: Callable[[str], str]) -> tuple[list[tuple[str, str]], list[Figure]]:
    reasons = report.reason_counts(d.table)
    facts = [("dead letters", _count(d.table.num_rows))] + [(f"reason {r}", _count(n)) for r, n in reasons]
    labels, counts = [r for r, _ in reasons], [n for _, n in reasons]
    title = "dead letters by reason"
    drawn = svg.bar_chart(fid("fig-dead-letters"), labels, counts, title=title, xlabel="records") if reasons else None
    return facts, [Figure(fid("fig-dead-letters"), "dead letters by reason", drawn, empty="no dead letters")]


def _representations(d: report.Dataset, fid: Callable[[str], str]) -> tuple[list[tuple[str, str]], list[Figure]]:
    stats = report.representation_stats(d.table)
    facts = [(k.replace("_", " "), f"{v:.4g}" if isinstance(v, float) else json.dumps(v)) for k, v in stats.items()]
    vectors = report.embedding_vectors(d.table)
    norms = np.linalg.norm(vectors, axis=1) if vectors.size else np.zeros(0)
    coords, explained = report.pca_2d(vectors)
    is_user = np.asarray(pc.is_null(d.table.column("ad_id")).to_numpy(zero_copy_only=False), dtype=bool)
    if len(coords) < len(is_user):  # pca_2d kept evenly spaced rows
        is_user = is_user[np.linspace(0, len(is_user) - 1, len(coords)).astype(np.int64)]
    labels = [f"PC{i + 1} ({share:.0%} of variance)" for i, share in enumerate(explained)]
    figures = [
        Figure(
            fid("fig-embedding-norms"),
            "L2 norm of each embedding",
            svg.histogram(fid("fig-embedding-norms"), norms, title="embedding norms", xlabel="L2 norm")
            if norms.size
            else None,
            empty="no embeddings",
        ),
        Figure(
            fid("fig-embedding-pca"),
            f"embeddings on their first two principal components ({len(coords):,} rows)",
            svg.scatter(
                fid("fig-embedding-pca"),
                coords,
                {"user-level": is_user, "(user, ad) pair": ~is_user},
                title="2-D projection (PCA)",
                labels=labels,
            )
            if len(coords) >= 2
            else None,
            empty="fewer than two embeddings",
        ),
    ]
    return facts, figures


def _numbered(n: int) -> Callable[[str], str]:
    """Figure ids of the ``n``-th dataset of a kind: ``fig-x``, then ``fig-x-2``, ..."""
    return lambda base: base if n == 1 else f"{base}-{n}"


_BUILDERS = {"history": _history, "dead_letter": _dead_letters, "representation": _representations}


def build_sections(datasets: Sequence[report.Dataset]) -> list[Section]:
    """One section per dataset: layout, rows and files, then what its layout shows, then its schema."""
    seen: dict[str, int] = {}
    sections: list[Section] = []
    for d in datasets:
        kind = d.layout[0] if d.layout else None
        layout = f"{d.layout[0]} v{d.layout[1]}" if d.layout else "unknown (no gem.layout metadata)"
        facts = [("layout", layout), ("rows", _count(d.table.num_rows)), ("files", _count(len(d.files)))]
        figures: list[Figure] = []
        if kind in _BUILDERS:
            seen[kind] = n = seen.get(kind, 0) + 1
            more, figures = _BUILDERS[kind](d, _numbered(n))
            facts += more
        elif kind == "training_example":
            facts += [(f"{k} rate", f"{v:.2%}") for k, v in report.example_label_rates(d.table).items()]
        sections.append(Section(f"data-{len(sections) + 1}", d.name, facts, _schema(d.table), figures))
    return sections


def build_report(
    title: str,
    datasets: Sequence[report.Dataset],
    summary: Mapping[str, object] | None = None,
    balances: Sequence[Balance] = (),
    notes: Sequence[str] = (),
) -> str:
    """The whole page: summary.json with its balances checked, then one section per dataset."""
    checks = balance_lines(summary, balances) if summary is not None else []
    return render_page(title, build_sections(datasets), summary, checks, notes)
