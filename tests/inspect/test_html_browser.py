"""`inspect --html` opened in headless Chromium: the page renders with no console error, every figure
is drawn, and nothing in it points at the network. A features snapshot and a representations snapshot."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from pipelines.cli import main
from pipelines.inspect.html import FIGURES
from tests.fixtures.browser import open_page
from tests.precompute.conftest import World

pytestmark = pytest.mark.integration

URL = re.compile(r"https?://|//[a-z0-9.-]+\.[a-z]{2,}/", re.IGNORECASE)
#: A figure's drawn size and its shapes: an <svg> with width, height and marks in it.
FIGURE_JS = """
const f = document.getElementById(arguments[0]);
if (!f) return null;
const svg = f.querySelector('svg');
if (!svg) return {svg: false};
const box = svg.getBoundingClientRect();
return {svg: true, width: box.width, height: box.height,
        marks: svg.querySelectorAll('path, rect, use, polygon').length};
"""


def _report(snapshot: Path, tmp_path: Path) -> Path:
    html = tmp_path / "report.html"
    assert main(["inspect", str(snapshot), "--html", str(html)]) == 0
    return html


def _check_page(chromium: Any, html: Path, figures: tuple[str, ...]) -> None:
    text = html.read_text()
    assert not URL.search(text.replace('href="#', "")), URL.search(text)
    page = open_page(chromium, html)
    assert page.console == [], page.console
    for figure in figures:
        drawn = page.js(FIGURE_JS, figure)
        assert drawn and drawn["svg"], f"{figure}: {drawn}"
        assert drawn["width"] > 100 and drawn["height"] > 100 and drawn["marks"] > 3, f"{figure}: {drawn}"
    # the page asked the network for nothing: every resource it loaded is the file itself
    loaded = page.js("return performance.getEntriesByType('resource').map(e => e.name)")
    assert loaded == [], loaded


@pytest.fixture(scope="module")
def features_snapshot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.features.factories import T0, line

    root = tmp_path_factory.mktemp("html-features")
    lines = [
        line(
            event_id=f"e{i}", user_id=i % 7, event_time=T0 + i * 3_600_000, surface="threads" if i % 3 else "messenger"
        )
        for i in range(120)
    ] + [b"{oops", b"[]"]
    (root / "e.jsonl").write_bytes(b"\n".join(lines))
    assert main(["features", "--input", str(root / "e.jsonl"), "--output", str(root / "out")]) == 0
    return root / "out"


def test_features_report_in_chromium(chromium: Any, features_snapshot: Path, tmp_path: Path) -> None:
    html = _report(features_snapshot, tmp_path)
    _check_page(chromium, html, FIGURES["history"] + FIGURES["dead_letter"])
    text = html.read_text()
    assert "holds: record balance: records_in 122 = events_valid 120" in text
    assert "invalid_json" in text and "not_an_object" in text


def test_representations_report_in_chromium(chromium: Any, world: World, tmp_path: Path) -> None:
    out = tmp_path / "reps"
    args = ["--features", str(world.features), "--candidates", str(world.candidates), "--model", str(world.model)]
    assert main(["precompute", *args, "--all-users", "--output", str(out)]) == 0
    html = _report(out, tmp_path)
    _check_page(chromium, html, FIGURES["representation"])
    text = html.read_text()
    assert "holds: pair balance: pairs_in" in text
    assert "user-level (" in text and "(user, ad) pair (" in text
