"""One output, one group, one topic: an output records the stream it was built from,
its commits name it, and a start that mixes outputs and groups is refused with the fix."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import pytest

from pipelines.errors import ConfigError
from pipelines.io.kafka.config import KafkaConnection
from pipelines.streaming.ownership import STATE_FILE, claim_output, commit_metadata, output_of_metadata, read_owner
from pipelines.streaming.state import latest_histories
from tests.fixtures.kafka import MakeTopic, produce
from tests.streaming.streams import committed, generate, keyed, replay, same_histories, stream_cmd


def test_a_first_start_records_the_stream_and_a_restart_finds_it(tmp_path: Path) -> None:
    out = str(tmp_path / "out")
    owner = claim_output(out, "t", "g", 3, {0: None, 1: None, 2: None}, holds_state=False)
    assert read_owner(out) == owner and json.loads(Path(out, STATE_FILE).read_text())["group"] == "g"
    mine = commit_metadata(owner, out)
    assert output_of_metadata(mine) == (owner.id, str(Path(out).resolve()))
    again = claim_output(out, "t", "g", 3, {0: (5, mine), 1: None, 2: (7, "")}, holds_state=True)
    assert again == owner


@pytest.mark.parametrize(
    ("topic", "group", "partitions", "flag", "fix"),
    [
        ("t", "other", 3, "--group", "pass --group g"),
        ("t2", "g", 3, "--topic", "pass --topic t"),
        ("t", "g", 4, "--topic", "new --output"),
    ],
)
def test_a_restart_with_another_group_topic_or_partition_count_is_refused(
    tmp_path: Path, topic: str, group: str, partitions: int, flag: str, fix: str
) -> None:
    out = str(tmp_path / "out")
    claim_output(out, "t", "g", 3, {}, holds_state=False)
    with pytest.raises(ConfigError) as raised:
        claim_output(out, topic, group, partitions, {}, holds_state=True)
    assert raised.value.flag == flag and fix in str(raised.value)


def test_a_group_committed_by_another_output_is_refused(tmp_path: Path) -> None:
    first = claim_output(str(tmp_path / "a"), "t", "g", 1, {}, holds_state=False)
    theirs = commit_metadata(first, str(tmp_path / "a"))
    with pytest.raises(ConfigError, match=r"committed by the stream into .*/a") as raised:
        claim_output(str(tmp_path / "b"), "t", "g", 1, {0: (10, theirs)}, holds_state=False)
    assert "a --group of its own" in str(raised.value)
    assert not (tmp_path / "b" / STATE_FILE).exists()


def test_a_new_output_on_a_group_with_commits_is_refused_and_an_old_output_adopted(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="holds no streamed state"):
        claim_output(str(tmp_path / "new"), "t", "g", 1, {0: (10, "")}, holds_state=False)
    # an output streamed before outputs recorded their stream, with its group's plain commits
    adopted = claim_output(str(tmp_path / "old"), "t", "g", 1, {0: (10, "")}, holds_state=True)
    assert read_owner(str(tmp_path / "old")) == adopted


@pytest.mark.integration
def test_a_second_output_on_one_group_is_refused_and_the_first_resumes(
    kafka: KafkaConnection, make_topic: MakeTopic, tmp_path: Path, prism: str
) -> None:
    lines = generate(tmp_path, 60, seed=29)
    topic, group = make_topic(2), f"g-{uuid.uuid4().hex[:8]}"
    first, rest = lines[: len(lines) // 2], lines[len(lines) // 2 :]
    produce(kafka, topic, first, keys=keyed(first))
    out_a, out_b = tmp_path / "a", tmp_path / "b"
    _ok(stream_cmd(topic, group, out_a, "--idle-exit", "2"))
    assert sum(c or 0 for c in committed(kafka, topic, group, 2)) == len(first)
    produce(kafka, topic, rest, keys=keyed(rest))
    # the repro: a second job on the same group, into another output, resumed from the first one's commits
    refused = _run(stream_cmd(topic, group, out_b, "--idle-exit", "2"))
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "error: --group" in refused.stderr and f"committed by the stream into {out_a}" in refused.stderr
    assert "Fix:" in refused.stderr and "Traceback" not in refused.stderr
    assert not (out_b / "histories").exists()
    # the first output with another group: refused too, naming its group
    other = _run(stream_cmd(topic, f"{group}-x", out_a, "--idle-exit", "2"))
    assert other.returncode == 2 and f"pass --group {group}" in other.stderr, other.stderr[-3000:]
    # the first output with its own group resumes and ends complete
    _ok(stream_cmd(topic, group, out_a, "--idle-exit", "2"))
    same_histories(latest_histories(str(out_a)), replay(topic, tmp_path / "batch"))


def _run(command: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=240)


def _ok(command: list[str]) -> None:
    done = _run(command)
    assert done.returncode == 0, done.stderr[-3000:]
