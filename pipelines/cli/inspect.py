"""Summarise any Parquet output of this project.

PATH may be a Parquet file, a folder of parts, or a features output folder (its
histories/, training_examples/ and dead_letters/ are each summarised). Shows the
layout and version, row counts, history-length percentiles with a text
histogram, the surface and event-type mix, label rates and dead-letter reasons.

--html REPORT.html writes the same as one self-contained page (no network fetch:
figures are inline SVG): summary.json with its record balance checked, each
dataset's schema, the history-length, surface and event-type distributions, a
timeline, the dead letters by reason, and for representations the embedding norms
and a 2-D projection (PCA).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pyarrow as pa

from pipelines.errors import LayoutError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", metavar="PATH", help="a Parquet file or folder written by this project")
    parser.add_argument("--user", type=int, metavar="ID", help="print this user's history timeline")
    parser.add_argument("--plot", metavar="FILE.png", help="save the history distributions to a PNG")
    parser.add_argument(
        "--html", metavar="REPORT.html", help="write a self-contained HTML report (figures inline, nothing fetched)"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace the --html file if it exists")


def _print_dataset(d, args: argparse.Namespace) -> None:
    from pipelines.inspect import report

    layout = f"{d.layout[0]} v{d.layout[1]}" if d.layout else "unknown layout (no gem.layout metadata)"
    print(f"== {d.name}: {d.table.num_rows} rows in {len(d.files)} file(s), {layout}")
    print("   columns: " + ", ".join(f"{f.name}:{f.type}" for f in d.table.schema))
    kind = d.layout[0] if d.layout else None
    if kind == "history":
        lengths = report.history_lengths(d.table)
        pct = report.percentiles(lengths)
        print(
            f"   events retained: {int(lengths.sum())}; per user p50={pct[50]:.0f} p90={pct[90]:.0f} "
            f"p99={pct[99]:.0f} max={pct[100]:.0f}"
        )
        print("\n".join("   " + line for line in report.text_histogram(lengths)))
        for name, mix in report.history_event_mix(d.table).items():
            print(f"   {name} mix: " + ", ".join(f"{n} {share:.1%}" for n, _, share in mix))
        if args.user is not None:
            print("\n".join(report.user_timeline(d.table, args.user)))
        if args.plot:
            from pipelines.inspect.plot import save_plot

            print(f"   plot: {save_plot(args.plot, lengths, report.history_event_mix(d.table))}")
    elif kind == "training_example":
        print(f"   label rates: {json.dumps(report.example_label_rates(d.table))}")
    elif kind == "representation":
        print(f"   {json.dumps(report.representation_stats(d.table))}")
    elif kind == "dead_letter":
        for reason, n in report.reason_counts(d.table):
            print(f"   {reason:<26} {n}")


def _balances(summary_file: Path) -> list:
    """The record balances a summary.json of this project keeps (features, precompute)."""
    summary = json.loads(summary_file.read_text()) if summary_file.is_file() else {}
    found = []
    if "records_in" in summary:
        from pipelines.features.pipeline import RECORDS

        found.append(RECORDS)
    if "pairs_in" in summary:
        from pipelines.precompute.pipeline import PAIRS

        found.append(PAIRS)
    return found


def run(args: argparse.Namespace) -> int:
    from pipelines.inspect.report import find_datasets, is_streaming_output

    if args.html:
        from pipelines.inspect.output import check_report_path

        check_report_path(args.path, args.html, overwrite=args.overwrite)
    try:  # refuses an uncommitted or damaged snapshot before printing anything
        datasets = find_datasets(args.path)
    except pa.ArrowException as exc:  # not Parquet at all (e.g. a text file)
        raise LayoutError(
            f"{args.path}: not a Parquet file or folder of this project ({exc}). Fix: pass a Parquet file or "
            "an --output folder of features, replay, precompute, index or stream"
        ) from exc
    if is_streaming_output(Path(args.path)):
        print("== a streaming job's output: flush files, each user's newest row is its current history")
    summary = Path(args.path) / "summary.json"
    if summary.is_file():
        print(f"== summary.json\n{summary.read_text()}")
    for dataset in datasets:
        _print_dataset(dataset, args)
    if args.html:
        from pipelines.inspect.output import write_html_report

        balances = _balances(summary)
        print(
            f"== html report: {write_html_report(args.path, args.html, datasets, balances, overwrite=args.overwrite)}"
        )
    return 0
