"""`lookup` takes its staleness bound from --max-age, else from the store URI's ?max_age=."""

from __future__ import annotations

import argparse

import pytest

from pipelines.cli.flags import duration
from pipelines.cli.lookup import _ages


def _args(store: str, max_age: str | None = None, fallback: str | None = None) -> argparse.Namespace:
    def parsed(text: str | None) -> float | None:  # as argparse gives them: --max-age and co. are durations
        return None if text is None else duration(text)

    return argparse.Namespace(store=store, max_age=parsed(max_age), fallback_max_age=parsed(fallback))


@pytest.mark.parametrize(
    ("store", "max_age", "fallback", "expected"),
    [
        ("lmdb:///tmp/s", None, None, (3600.0, 7 * 86400.0)),
        ("lmdb:///tmp/s?max_age=15m", None, None, (900.0, 7 * 86400.0)),
        ("redis://127.0.0.1:16379/0?max_age=30d", None, None, (30 * 86400.0, 30 * 86400.0)),
        ("lmdb:///tmp/s?max_age=15m", "2h", None, (7200.0, 7 * 86400.0)),  # the flag wins
        ("lmdb:///tmp/s?max_age=15m", None, "1d", (900.0, 86400.0)),
    ],
)
def test_max_age_comes_from_the_flag_else_the_store_uri(
    store: str, max_age: str | None, fallback: str | None, expected: tuple[float, float]
) -> None:
    assert _ages(_args(store, max_age, fallback)) == expected
