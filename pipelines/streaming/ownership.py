"""Which stream an output folder and a consumer group belong to: one output, one group, one topic.

A stream's output folder is its state (flush files), and its consumer group's committed
offsets say how far that state goes. The two only make sense together: a job that resumed
an output from another output's commits would skip everything the other job had read (a
restarted job was seen to publish 288 of 4,762 users this way, exit 0). So:

- the output records its topic, group, partition count and a random id in
  ``OUTPUT/_stream.json`` (:data:`STATE_FILE`), written on the first start;
- every offset the job commits carries that id as the commit's metadata
  (:func:`commit_metadata`);
- a start (:func:`claim_output`, under the output's writer lock) refuses, with the fix,
  an output recorded for another topic, group or partition count, and a group whose
  commits carry another output's id, or that has commits while the output holds nothing.

Pure: the caller reads the group's commits and passes them in.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from pipelines.errors import ConfigError

__all__ = ["STATE_FILE", "StreamOwner", "claim_output", "commit_metadata", "output_of_metadata", "read_owner"]

STATE_FILE = "_stream.json"
_PREFIX = "gem-stream"
#: Kafka keeps at most offset.metadata.max.bytes (4096 by default) of metadata per commit.
_MAX_METADATA = 1024


@dataclass(frozen=True)
class StreamOwner:
    """What an output folder was streamed from: ``id`` is the output's, carried by every commit."""

    topic: str
    group: str
    partitions: int
    id: str


def commit_metadata(owner: StreamOwner, output: str) -> str:
    """The metadata of every offset commit: the output's id and where it is (for error messages)."""
    return f"{_PREFIX}:{owner.id}:{os.path.abspath(output)}"[:_MAX_METADATA]


def output_of_metadata(metadata: str | None) -> tuple[str, str] | None:
    """(output id, output path) of a commit made by a stream job; None for any other commit."""
    if not metadata or not metadata.startswith(f"{_PREFIX}:"):
        return None
    _, owner, path = [*metadata.split(":", 2), ""][:3]
    return owner, path


def read_owner(output: str) -> StreamOwner | None:
    """The output's recorded stream (None when it records none)."""
    path = Path(output, STATE_FILE)
    try:
        found = json.loads(path.read_text())
        return StreamOwner(str(found["topic"]), str(found["group"]), int(found["partitions"]), str(found["id"]))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            "--output",
            f"{path} cannot be read ({exc})",
            "stream into a new --output with a new --group; this one's state is unknown",
        ) from exc


def claim_output(
    output: str,
    topic: str,
    group: str,
    partitions: int,
    commits: Mapping[int, tuple[int, str] | None],
    *,
    holds_state: bool,
) -> StreamOwner:
    """The output's :class:`StreamOwner`, recorded now on a first start; :class:`ConfigError` naming the fix
    when the output, the group and the topic do not belong together.

    ``commits``: partition -> (committed offset, commit metadata) of ``group`` on ``topic`` (None: none).
    ``holds_state``: whether the output already holds flush files (one written before outputs recorded
    their stream is adopted)."""
    recorded = read_owner(output)
    if recorded is not None:
        _check_recorded(output, recorded, topic, group, partitions)
    foreign = _foreign_commit(commits, None if recorded is None else recorded.id)
    if foreign is not None:
        where = f"the stream into {foreign}" if foreign else "another stream job"
        raise ConfigError(
            "--group",
            f"group {group!r} holds offsets of topic {topic!r} committed by {where}; resumed from them, "
            f"{output} would miss every event that job read before",
            f"give this --output a --group of its own (it starts from --from), or resume {foreign or 'that job'} "
            "with its own --output",
        )
    if recorded is None and not holds_state and any(c is not None for c in commits.values()):
        raise ConfigError(
            "--group",
            f"group {group!r} already holds committed offsets of topic {topic!r}, but {output} holds no "
            "streamed state: resumed from them, it would miss every event before them",
            "give this new --output a new --group (it starts from --from), or pass the --output that "
            "group was streaming into",
        )
    if recorded is not None:
        return recorded
    owner = StreamOwner(topic, group, partitions, uuid.uuid4().hex)
    _write(output, owner)
    return owner


def _check_recorded(output: str, recorded: StreamOwner, topic: str, group: str, partitions: int) -> None:
    for flag, was, now in (("--topic", recorded.topic, topic), ("--group", recorded.group, group)):
        if was != now:
            raise ConfigError(
                flag,
                f"{output} was streamed from topic {recorded.topic!r} with group {recorded.group!r}, not {now!r}",
                f"pass {flag} {was} to resume it, or stream into a new --output (with a new --group)",
            )
    if recorded.partitions != partitions:
        raise ConfigError(
            "--topic",
            f"topic {topic!r} had {recorded.partitions} partition(s) when {output} began, and has {partitions} now: "
            "the group's offsets no longer cover the topic",
            "stream into a new --output with a new --group, or rebuild the histories with replay",
        )


def _foreign_commit(commits: Mapping[int, tuple[int, str] | None], own_id: str | None) -> str | None:
    """The output path (or "" when unknown) named by a commit of another output; None when there is none."""
    for commit in commits.values():
        made_by = None if commit is None else output_of_metadata(commit[1])
        if made_by is not None and made_by[0] != own_id:
            return made_by[1]
    return None


def _write(output: str, owner: StreamOwner) -> None:
    target = Path(output, STATE_FILE)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{STATE_FILE}.tmp")
    tmp.write_text(json.dumps(asdict(owner), indent=1) + "\n")
    os.replace(tmp, target)
