"""Snapshots under concurrent use: the writer lock names its holder from the first instant, reads stay
pinned to the snapshot they checked, and an --output never eats an input (issue 29, items 1, 2, 14).

Each race is made certain with a pause point (:mod:`pipelines.io.pause`): the first process is stopped
at an exact step while the second runs, so no case depends on timing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.recovery.conftest import World
from tests.recovery.crash import cli, paused_at, record, short, staging_of

pytestmark = pytest.mark.integration


def _features_args(world: World, out: Path, *extra: str) -> list[str]:
    return ["features", "--input", str(world.events), "--output", str(out), *extra]


def test_the_lock_names_its_holder_from_the_moment_it_is_taken(world: World, tmp_path: Path) -> None:
    """The holder stops right after its lock became visible; the second writer must name its pid."""
    out = tmp_path / "features"
    with paused_at("lock-taken", _features_args(world, out), tmp_path / "pause") as holder:
        second = cli(*_features_args(world, out))
    assert second.returncode == 2, second.stderr
    assert f"is being written right now by pid {holder.pid} " in second.stderr, second.stderr
    assert holder.returncode == 0, (tmp_path / "pause" / "stderr.log").read_text()[-3000:]
    assert (out / "_COMMITTED").is_file() and not staging_of(out)
    record("second writer at the lock's first instant", short(second.stderr.strip().splitlines()[-1]))
