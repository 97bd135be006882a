"""Candidate sets on the wire: JSON round trip, reasons for bad payloads, funnel files in `produce`."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa

from pipelines.generator import WorldConfig, generate_events, rngs
from pipelines.generator.funnel import generate_funnel
from pipelines.io.kafka.candidate_sets import candidate_sets_to_wire, decode_candidate_sets
from pipelines.io.kafka.produce import file_messages
from pipelines.io.parquet import write_table
from pipelines.schemas.layouts import CANDIDATE_SET


def _funnel(requests: int = 20) -> pa.Table:
    generated = generate_events(WorldConfig(users=200, days=2, seed=4))
    return generate_funnel(generated.world, generated.events, requests, rngs(4)["funnel"])


def test_round_trip_keyed_by_user() -> None:
    funnel = _funnel()
    messages = candidate_sets_to_wire(funnel)
    assert [int(k or b"") for k, _ in messages] == funnel["user_id"].to_pylist()
    first = json.loads(messages[0][1])
    assert first["stage"] == "retrieval" and isinstance(first["stage_time"], int)
    decoded = decode_candidate_sets([v for _, v in messages])
    assert not decoded.bad and decoded.table.equals(funnel.cast(CANDIDATE_SET.schema))


def test_bad_payloads_get_a_reason() -> None:
    good = candidate_sets_to_wire(_funnel(2))[0][1]
    value = json.loads(good)
    payloads = [
        b"{not json",
        json.dumps({k: v for k, v in value.items() if k != "needed_by"}).encode(),
        json.dumps(value | {"stage": "final"}).encode(),
        json.dumps(value | {"ad_ids": ["a"]}).encode(),
        json.dumps(value | {"user_id": True}).encode(),
        good,
    ]
    decoded = decode_candidate_sets(payloads)
    assert decoded.bad == {0: "bad_json", 1: "missing_field", 2: "bad_enum", 3: "bad_type", 4: "bad_type"}
    assert decoded.rows.tolist() == [5] and decoded.table.num_rows == 1


def test_produce_reads_a_funnel_file_as_candidate_sets(tmp_path: Path) -> None:
    funnel = _funnel(15)
    path = write_table(funnel, str(tmp_path / "funnel.parquet"), CANDIDATE_SET)
    total, batches = file_messages(path, batch=7)
    messages = [m for batch in batches for m in batch]
    assert total == funnel.num_rows == len(messages)
    assert decode_candidate_sets([v for _, v in messages]).table.equals(funnel.cast(CANDIDATE_SET.schema))
