"""Where ``inspect --html`` writes: checked before any reading, written whole or not at all."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from pipelines.errors import ConfigError
from pipelines.inspect.report import Dataset, is_streaming_output
from pipelines.io.summary import SUMMARY, Balance
from pipelines.redact import redact

__all__ = ["check_report_path", "write_html_report"]

FLAG = "--html"


def check_report_path(inspected: str, html: str, *, overwrite: bool) -> None:
    """Refuse a report path inside what is inspected, a folder, a missing parent, or an existing
    file without ``overwrite``: all before anything is read."""
    target, source = Path(html).resolve(), Path(inspected).resolve()
    if target == source or source in target.parents:
        raise ConfigError(FLAG, f"{html!r} is inside the inspected {inspected!r}", "write the report outside PATH")
    if target.is_dir():
        raise ConfigError(FLAG, f"{html!r} is a folder", "give a file name, such as report.html")
    if not target.parent.is_dir():
        raise ConfigError(FLAG, f"the folder {str(target.parent)!r} does not exist", "create it first")
    if target.exists() and not overwrite:
        raise ConfigError(FLAG, f"{html!r} already exists", "add --overwrite to replace it, or choose another name")


def write_html_report(
    inspected: str, html: str, datasets: Sequence[Dataset], balances: Sequence[Balance] = (), *, overwrite: bool
) -> str:
    """Render the report of ``datasets`` (read from ``inspected``) and write it to ``html`` atomically."""
    from pipelines.inspect.html import build_report

    check_report_path(inspected, html, overwrite=overwrite)
    summary_file = Path(inspected) / SUMMARY
    summary = json.loads(summary_file.read_text()) if summary_file.is_file() else None
    notes = []
    if is_streaming_output(Path(inspected)):
        notes.append("A streaming job's output: flush files; each user's newest row is its current history.")
    text = build_report(f"inspect: {redact(inspected)}", datasets, summary, balances, notes)
    target = Path(html)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return str(target)
