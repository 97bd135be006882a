"""The HTML report's pure parts: page text, balances, PCA, timeline bins, SVG cleaning, and the --html flag."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipelines.cli import main
from pipelines.inspect import svg
from pipelines.inspect.page import Figure, Section, balance_lines, render_page
from pipelines.inspect.report import event_timeline, pca_2d
from pipelines.io.summary import Balance
from tests.inspect.test_inspect import features_out  # noqa: F401 - a fixture, used by name


def test_page_escapes_and_links_sections() -> None:
    section = Section(
        "data-1", "<histories>", [("rows", "1,024")], [("a", "int64", False)], [Figure("fig-x", "c", "<svg></svg>")]
    )
    page = render_page("inspect: a&b", [section], {"records_in": 3}, [("record balance: ...", False)])
    assert "<title>inspect: a&amp;b</title>" in page and "&lt;histories&gt;" in page
    assert '<a href="#summary">' in page and '<a href="#data-1">' in page
    assert '<figure id="fig-x"><svg></svg>' in page and '<td class="num">1,024</td>' in page
    assert "BROKEN: record balance" in page
    assert "default-src 'none'" in page  # the browser refuses any fetch


def test_an_empty_figure_says_why() -> None:
    page = render_page("t", [Section("s", "s", figures=[Figure("fig-dead-letters", "c", None, "no dead letters")])])
    assert '<figure id="fig-dead-letters"><p class="note">no dead letters</p>' in page


def test_balance_lines() -> None:
    b = Balance("record", "records_in", ("valid", "dead"), unless="failed")
    assert balance_lines({"records_in": 5, "valid": 4, "dead": 1}, [b]) == [
        ("record balance: records_in 5 = valid 4 + dead 1", True)
    ]
    assert balance_lines({"records_in": 5, "valid": 4}, [b])[0][1] is False
    assert balance_lines({"records_in": 5, "failed": 1}, [b]) == []  # the balance does not apply
    assert balance_lines({"pairs_in": 5}, [b]) == []


def test_pca_finds_the_long_axis() -> None:
    rng = np.random.default_rng(0)
    direction = np.array([3.0, 4.0, 0.0]) / 5
    x = rng.normal(size=(500, 1)) * 10 * direction + rng.normal(size=(500, 3)) * 0.1
    coords, explained = pca_2d(x.astype(np.float32))
    assert coords.shape == (500, 2) and explained[0] > 0.99
    assert abs(np.corrcoef(coords[:, 0], x @ direction)[0, 1]) > 0.999
    assert pca_2d(x, max_rows=100)[0].shape == (100, 2)
    assert pca_2d(np.zeros((1, 3)))[0].shape == (1, 2)


def test_timeline_bins_by_hour_or_day() -> None:
    hour, day = 3_600_000, 86_400_000
    starts, counts, unit = event_timeline(np.array([0, 10, hour + 5, 3 * hour]))
    assert unit == "hour" and counts.tolist() == [2, 1, 0, 1] and starts.tolist() == [0, hour, 2 * hour, 3 * hour]
    starts, counts, unit = event_timeline(np.array([day + 1, 5 * day - 1]))
    assert unit == "day" and counts.tolist() == [1, 0, 0, 1] and starts[0] == day
    assert event_timeline(np.zeros(0, np.int64))[1].size == 0


def test_svg_is_inline_and_fetches_nothing() -> None:
    text = svg.bar_chart("fig-t", ["a", "b"], [3, 1], title="t", xlabel="n")
    assert text.startswith("<svg") and text.endswith("</svg>")
    assert "http" not in text and "xmlns" not in text and "<metadata" not in text
    assert "fig-t" not in text  # the salt only seeds the ids


def test_html_flag(features_out: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    report = tmp_path / "r.html"
    assert main(["inspect", str(features_out), "--html", str(report)]) == 0
    assert report.read_text().startswith("<!DOCTYPE html>")
    assert main(["inspect", str(features_out), "--html", str(report)]) == 2
    assert "already exists. Fix: add --overwrite" in capsys.readouterr().err
    assert main(["inspect", str(features_out), "--html", str(report), "--overwrite"]) == 0
    assert main(["inspect", str(features_out), "--html", str(features_out / "r.html")]) == 2
    assert "inside the inspected" in capsys.readouterr().err and not (features_out / "r.html").exists()
    assert main(["inspect", str(features_out), "--html", str(tmp_path / "no" / "r.html")]) == 2
    assert "does not exist. Fix: create it first" in capsys.readouterr().err
