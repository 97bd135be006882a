"""The streaming job's graph: only the checkpoint-committing (Flink) job asks for bundle finalization.

A DoFn that takes a bundle finalizer makes Prism send FinalizeBundle after every bundle of its
stage, and the SDK answers each one for a bundle that registered nothing with a logged traceback
("Bundle is not in a finalizable state")."""

from __future__ import annotations

import apache_beam as beam
import pytest
from apache_beam.portability.api import beam_runner_api_pb2

from pipelines.io.kafka.config import KafkaConnection
from pipelines.streaming.config import StreamConfig
from pipelines.streaming.job import PartitionStart, build_stream


def _finalizing_steps(checkpointed: bool) -> list[str]:
    p = beam.Pipeline()
    config = StreamConfig(topic="t", output="/nonexistent/out", group="g", checkpointed=checkpointed)
    build_stream(p, KafkaConnection(bootstrap_servers=("127.0.0.1:1",)), config, [PartitionStart("t", 0, 0)])
    found = []
    for transform in p.to_runner_api().components.transforms.values():
        if transform.spec.urn == "beam:transform:pardo:v1":
            payload = beam_runner_api_pb2.ParDoPayload.FromString(transform.spec.payload)
            found += [transform.unique_name] if payload.requests_finalization else []
    return found


@pytest.mark.parametrize(("checkpointed", "expected"), [(False, []), (True, ["CommitOffsets"])])
def test_only_commits_on_checkpoints_ask_for_bundle_finalization(checkpointed: bool, expected: list[str]) -> None:
    assert _finalizing_steps(checkpointed) == expected
