"""The ranking funnel: stages narrow, in time order, with realistic gaps, at the world's activity; deterministic."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from pipelines.generator import GeneratedEvents, rngs
from pipelines.generator.candidates import score_ads
from pipelines.generator.funnel import FunnelConfig, generate_funnel, late_requests, stage_rows
from pipelines.io.parquet import read_table
from pipelines.schemas.enums import FUNNEL_STAGES
from pipelines.schemas.layouts import CANDIDATE_SET, CANDIDATES, layout_of

ROOT = Path(__file__).resolve().parents[2]
REQUESTS = 1500


@pytest.fixture(scope="module")
def funnel(medium: GeneratedEvents) -> pa.Table:
    return generate_funnel(medium.world, medium.events, REQUESTS, rngs(medium.world.config.seed)["funnel"])


def _by_request(funnel: pa.Table) -> dict[str, list[dict]]:
    rows: dict[str, list[dict]] = {}
    for row in funnel.to_pylist():
        rows.setdefault(row["request_id"], []).append(row)
    return rows


def test_layout_sizes_and_time_order(medium: GeneratedEvents, funnel: pa.Table) -> None:
    assert funnel.schema.equals(CANDIDATE_SET.schema)
    assert layout_of(funnel.schema) == ("candidate_set", CANDIDATE_SET.version)
    assert funnel.num_rows == REQUESTS * len(FUNNEL_STAGES)
    assert np.all(np.diff(funnel["stage_time"].cast(pa.int64()).to_numpy()) >= 0)
    sizes = np.minimum(FunnelConfig().sizes, medium.world.items.num_ads)
    for code, name in enumerate(FUNNEL_STAGES):
        lengths = pc.list_value_length(stage_rows(funnel, name)["ad_ids"]).to_numpy()
        assert np.all(lengths == sizes[code]), name


def test_each_stage_narrows_the_previous_one(funnel: pa.Table) -> None:
    for rows in list(_by_request(funnel).values())[:300]:
        rows.sort(key=lambda r: r["stage"])
        assert [r["stage"] for r in rows] == list(range(len(FUNNEL_STAGES)))
        assert len({(r["user_id"], r["surface"], r["needed_by"]) for r in rows}) == 1
        for wider, narrower in itertools.pairwise(rows):
            assert len(set(narrower["ad_ids"])) == len(narrower["ad_ids"])
            assert set(narrower["ad_ids"]) <= set(wider["ad_ids"])
            assert narrower["stage_time"] > wider["stage_time"]
        assert rows[0]["needed_by"] == rows[2]["stage_time"]  # the late stage is the deadline


def test_stage_gaps_are_tens_to_hundreds_of_ms(funnel: pa.Table) -> None:
    times = {name: stage_rows(funnel, name) for name in FUNNEL_STAGES}
    for before, after, median in zip(FUNNEL_STAGES, FUNNEL_STAGES[1:], FunnelConfig().gap_median_ms, strict=False):
        a = times[before].sort_by("request_id")["stage_time"].cast(pa.int64()).to_numpy()
        b = times[after].sort_by("request_id")["stage_time"].cast(pa.int64()).to_numpy()
        gap = b - a
        assert 0.8 * median < np.median(gap) < 1.25 * median
        assert 10 <= np.percentile(gap, 5) and np.percentile(gap, 95) <= 1000
        assert np.std(np.log(gap)) > 0.3  # lognormal spread, not a constant


def test_requests_follow_activity(medium: GeneratedEvents, funnel: pa.Table) -> None:
    users = medium.world.users
    late = stage_rows(funnel, "late")
    per_user = np.bincount(np.searchsorted(users.user_id, late["user_id"].to_numpy()), minlength=len(users.user_id))
    busy = users.activity >= np.percentile(users.activity, 90)
    quiet = users.activity <= np.percentile(users.activity, 50)
    assert per_user[busy].mean() > 5 * per_user[quiet].mean()
    hour = late["stage_time"].cast(pa.int64()).to_numpy() // 3_600_000
    local = (hour + users.tz_hours[np.searchsorted(users.user_id, late["user_id"].to_numpy())]) % 24
    evening, night = np.isin(local, [18, 19, 20, 21]).sum(), np.isin(local, [1, 2, 3, 4]).sum()
    assert evening > 3 * night


def test_later_stages_keep_better_ads(medium: GeneratedEvents, funnel: pa.Table) -> None:
    world = medium.world
    item_index = {int(i): n for n, i in enumerate(world.items.item_id.tolist())}
    means = []
    for name in FUNNEL_STAGES:
        rows = stage_rows(funnel, name).slice(0, 200)
        user = np.searchsorted(world.users.user_id, rows["user_id"].to_numpy())
        scores = []
        for r, ads in enumerate(rows["ad_ids"].to_pylist()):
            ad = np.array([item_index[a] for a in ads])
            scores.append(score_ads(world, user[r : r + 1], ad).mean())
        means.append(float(np.mean(scores)))
    assert means == sorted(means), means


def test_deterministic_for_a_seed(medium: GeneratedEvents, funnel: pa.Table) -> None:
    again = generate_funnel(medium.world, medium.events, REQUESTS, rngs(medium.world.config.seed)["funnel"])
    assert again.equals(funnel)
    other = generate_funnel(medium.world, medium.events, REQUESTS, rngs(medium.world.config.seed + 1)["funnel"])
    assert not other.equals(funnel)


def test_late_requests_are_the_late_stage(funnel: pa.Table) -> None:
    late = late_requests(funnel)
    assert late.schema.equals(CANDIDATES.schema) and late.num_rows == REQUESTS
    rows = stage_rows(funnel, "late")
    assert late["ad_ids"].equals(rows["ad_ids"]) and late["request_time"].equals(rows["stage_time"])


def test_generate_writes_the_funnel(tmp_path: Path) -> None:
    out, funnel = tmp_path / "events.parquet", tmp_path / "funnel.parquet"
    command = [sys.executable, "-m", "pipelines", "generate", "--users", "300", "--days", "2", "--output", str(out)]
    done = subprocess.run(
        [*command, "--funnel", str(funnel), "--funnel-requests", "40"], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    table = read_table(str(funnel), CANDIDATE_SET)
    assert table.num_rows == 40 * len(FUNNEL_STAGES)
    assert read_table(str(tmp_path / "funnel.late.parquet"), CANDIDATES).num_rows == 40
    bad = subprocess.run([*command, "--funnel-requests", "5"], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode != 0 and "--funnel-requests" in bad.stderr
