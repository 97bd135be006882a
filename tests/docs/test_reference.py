"""The generated reference pages hold everything the code defines, and every reason code the code
emits has its one description (the pages are rendered from those descriptions)."""

from __future__ import annotations

import argparse
import json
import shlex

import pyarrow as pa
import pytest

from pipelines.cli import COMMANDS, build_parser
from pipelines.features import reasons
from pipelines.io.kafka.candidate_sets import REASONS as CANDIDATE_SET_REASONS
from pipelines.io.kafka.candidate_sets import decode_candidate_sets
from pipelines.precompute.requests import MAX_ADS_PER_REQUEST, check_candidates
from pipelines.precompute.requests import REASONS as CANDIDATE_REASONS
from pipelines.schemas.layouts import LAYOUTS
from pipelines.store.registry import BACKENDS
from tests.docs.reference_hook import ROOT, load_hook


@pytest.fixture(scope="module")
def pages() -> dict[str, str]:
    return load_hook().render_pages()


def test_readme_is_a_front_door_of_at_most_150_lines() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines; move the detail into docs/"


def test_every_command_and_flag_is_on_the_cli_page(pages: dict[str, str]) -> None:
    page = pages["reference/cli.md"]
    for name in COMMANDS:
        assert f"\n## {name}\n" in page
        parser = build_parser([name])
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[name]
        section = page.split(f"\n## {name}\n", 1)[1].split("\n## ", 1)[0]
        for action in sub._actions:
            if action.help != argparse.SUPPRESS and not isinstance(action, argparse._HelpAction):
                for flag in action.option_strings:
                    assert f"`{flag}`" in section, f"{name} {flag} missing from the CLI reference"


def test_every_features_reason_has_one_description(pages: dict[str, str]) -> None:
    assert set(reasons.WHEN) == set(reasons.ALL)
    for code in reasons.ALL:
        assert f"| `{code}` |" in pages["reference/dead-letters.md"]


def test_every_candidate_row_reason_the_check_gives_is_documented(pages: dict[str, str]) -> None:
    table = pa.table(
        {
            "request_id": ["ok", "empty", "many", "range", "time"],
            "user_id": [1, 1, 1, -1, 1],
            "surface": pa.array([0, 0, 0, 0, 0], pa.int8()),
            "request_time": pa.array([1, 1, 1, 1, None], pa.timestamp("ms", tz="UTC")),
            "ad_ids": [[1], [], list(range(MAX_ADS_PER_REQUEST + 1)), [1], [1]],
        }
    )
    given = set(check_candidates(table, "c.parquet").dead_letters.column("reason").to_pylist())
    assert given == {"empty_candidates", "too_many_candidates", "out_of_range", "missing_field"}
    assert given | {"inference_error"} == set(CANDIDATE_REASONS)
    for code in CANDIDATE_REASONS:
        assert f"| `{code}` |" in pages["reference/dead-letters.md"]


def test_every_candidate_set_reason_the_decoder_gives_is_documented(pages: dict[str, str]) -> None:
    good = {
        "request_id": "r",
        "user_id": 1,
        "surface": "facebook_feed",
        "stage": "early",
        "stage_time": 1,
        "needed_by": 2,
        "ad_ids": [1],
    }
    payloads = [
        b"{not json",
        json.dumps({**good, "user_id": None}).encode(),
        json.dumps({**good, "stage": "nope"}).encode(),
        json.dumps({**good, "ad_ids": ["x"]}).encode(),
    ]
    assert set(decode_candidate_sets(payloads).bad.values()) == set(CANDIDATE_SET_REASONS)
    for code in CANDIDATE_SET_REASONS:
        assert f"| `{code}` |" in pages["reference/dead-letters.md"]


def test_every_layout_and_field_is_on_the_layouts_page(pages: dict[str, str]) -> None:
    page = pages["reference/layouts.md"]
    for name, layout in LAYOUTS.items():
        section = page.split(f"\n## {name}\n", 1)[1].split("\n## ", 1)[0]
        assert f"Version {layout.version}." in section
        for field in layout.schema:
            assert f"| `{field.name}` |" in section


def test_every_store_backend_is_on_the_store_uri_page(pages: dict[str, str]) -> None:
    page = pages["reference/store-uris.md"]
    for backend in BACKENDS:
        assert f"`{backend}`" in page and f"{backend}://" in page


def test_the_readme_has_one_example_per_command_and_each_parses() -> None:
    text = (ROOT / "README.md").read_text().replace("\\\n", " ")
    prefix = "python -m pipelines "
    examples = [shlex.split(line[len(prefix) :]) for line in text.splitlines() if line.startswith(prefix)]
    assert sorted({argv[0] for argv in examples}) == sorted(COMMANDS), "the README needs one example per command"
    for argv in examples:
        _, extra = build_parser(argv).parse_known_args(argv)
        assert not extra, f"README example {argv}: unknown flags {extra}"
