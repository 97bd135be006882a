"""A corrupted record batch is never read as events: on the wire (a real fetch response with a
flipped byte) the fetcher fails naming topic, partition and offset; on disk (a byte flipped in the
broker's log segment of a test topic) the streaming poller fails instead of returning records."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.io.kafka.config import KafkaConnection
from pipelines.io.kafka.consume import KafkaReadError, PartitionPoller, open_fetcher
from pipelines.io.kafka.ranges import PartitionRange
from pipelines.io.kafka.records import CorruptBatchError
from tests.features.factories import line
from tests.fixtures.kafka import MakeTopic, produce

pytestmark = pytest.mark.integration

#: The broker's log dirs when it runs from this checkout (scripts/kafka.sh).
LOG_DIR = Path(__file__).resolve().parents[3] / ".cache" / "kafka" / "data"


def test_a_batch_corrupted_on_the_wire_fails_the_read(kafka: KafkaConnection, make_topic: MakeTopic) -> None:
    topic = make_topic(partitions=1)
    produce(kafka, topic, [line(event_id=f"w{i}") for i in range(50)])
    fetcher = open_fetcher(kafka, max_batch=1000, stall_s=10)
    real = fetcher.fetch_once  # type: ignore[attr-defined]

    def corrupted(part: PartitionRange, position: int) -> bytes:
        data = bytearray(real(part, position))
        data[len(data) // 2] ^= 0x01  # one bit, inside a record value
        return bytes(data)

    fetcher.fetch_once = corrupted  # type: ignore[attr-defined]
    got = []
    try:
        with pytest.raises(KafkaReadError, match=rf"{topic}/0 at offset 0: .*batch at offset 0 fails its CRC-32C"):
            got = [batch for batch in fetcher.fetch(PartitionRange(topic, 0, 0, 50))]
    finally:
        fetcher.close()
    assert got == []


def test_a_batch_corrupted_on_disk_stops_the_streaming_poller(kafka: KafkaConnection, make_topic: MakeTopic) -> None:
    topic = make_topic(partitions=1)
    produce(kafka, topic, [line(event_id=f"d{i}") for i in range(50)])
    segment = LOG_DIR / f"{topic}-0" / "00000000000000000000.log"
    if not segment.exists():
        pytest.skip(f"the broker's log dir is not at {LOG_DIR} (a broker not run by scripts/kafka.sh)")
    data = bytearray(segment.read_bytes())
    at = data.rindex(b'"d49"') + 1
    data[at] ^= 0x01
    with open(segment, "r+b") as f:  # in place: the broker keeps the file open
        f.seek(at)
        f.write(bytes(data[at : at + 1]))
    poller = PartitionPoller(kafka)
    try:
        with pytest.raises(CorruptBatchError, match="CRC-32C"):
            for _ in range(50):  # the first polls may return nothing while the consumer connects
                batch, _ = poller.poll(topic, 0, 0, timeout_s=0.5)
                assert batch is None, "records of a corrupted batch were returned"
    finally:
        poller.close()
    with pytest.raises(KafkaReadError, match=rf"{topic}/0 at offset 0: .*CRC-32C"):
        fetcher = open_fetcher(kafka, max_batch=1000, stall_s=10)
        try:
            list(fetcher.fetch(PartitionRange(topic, 0, 0, 50)))
        finally:
            fetcher.close()
