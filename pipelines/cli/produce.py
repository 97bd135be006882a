"""Load a generator events file (or funnel file) into a Kafka topic (JSON wire format, key = user_id).

Reads --input (.jsonl, .jsonl.gz: lines are sent as they are, malformed ones
included, so that they reach the dead letters downstream; .parquet: rows are
encoded to the wire format; a funnel file from `generate --funnel` gives one
candidate-set message per request and stage, in time order), creates --topic with --num-partitions if it does not
exist, and sends every record with acks=all; the command ends only after the
broker acknowledged all of them. --rate caps messages per second (e.g. to feed
a streaming job at a steady rate). Connection flags (or GEM_KAFKA_* variables)
point it at any cluster (docs/guides/kafka.md).
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from pipelines.cli import flags
from pipelines.errors import ConfigError

if TYPE_CHECKING:
    from pipelines.io.kafka.config import KafkaConnection

ACCEPTS_BEAM_ARGS = False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--input",
        required=True,
        metavar="FILE",
        help="events file: .jsonl, .jsonl.gz, .parquet (or a funnel .parquet: candidate sets)",
    )
    flags.add_topic(parser, "topic to write (created when missing)")
    parser.add_argument(
        "--rate",
        type=flags.positive(float, zero=True),
        default=0.0,
        help="at most this many messages per second (default: as fast as possible)",
    )
    parser.add_argument(
        "--num-partitions",
        type=flags.positive(),
        default=4,
        help="partitions when the topic is created (default: %(default)s)",
    )
    flags.add_kafka_backend(parser)
    flags.add_progress(parser)
    flags.add_kafka_connection(parser)


class Pacer:
    """Sleeps so that ``sent`` messages take at least ``sent / rate`` seconds (clock injectable)."""

    def __init__(
        self, rate: float, clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep
    ) -> None:
        self._rate, self._clock, self._sleep = rate, clock, sleep
        self._start = clock()

    def wait(self, sent: int) -> None:
        if self._rate <= 0:
            return
        ahead = sent / self._rate - (self._clock() - self._start)
        if ahead > 0:
            self._sleep(ahead)


def _create_topic(connection: KafkaConnection, topic: str, partitions: int) -> bool:
    """Create ``topic`` when missing; a count or name the cluster refuses is an error naming the flag."""
    from kafka.errors import InvalidPartitionsError, InvalidTopicError, PolicyViolationError

    from pipelines.io.kafka.produce import ensure_topic

    try:
        return ensure_topic(connection, topic, partitions)
    except (InvalidPartitionsError, PolicyViolationError) as exc:
        raise ConfigError(
            "--num-partitions",
            f"the cluster refused a topic of {partitions} partitions ({type(exc).__name__})",
            "pass a smaller count (a Kafka cluster creates at most 10000 partitions per request; a few per "
            "consumer is plenty)",
        ) from exc
    except InvalidTopicError as exc:
        raise ConfigError(
            "--topic", f"{topic!r} is not a valid topic name", "use letters, digits, '.', '_', '-'"
        ) from exc


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from pipelines.io.kafka.config import connection_from_args
    from pipelines.io.kafka.consume import open_lookup
    from pipelines.io.kafka.produce import file_messages, open_sink, topic_partitions

    logging.getLogger("kafka").setLevel(logging.WARNING)  # its INFO lines are per-connection noise
    connection = connection_from_args(args)
    open_lookup(connection).close()  # fails fast, naming the flag, when the cluster is unreachable
    total, batches = file_messages(args.input, batch=max(1, min(10_000, int(args.rate) or 10_000)))
    created = _create_topic(connection, args.topic, args.num_partitions)
    sink = open_sink(connection, args.topic, args.kafka_backend)
    started, sent, unkeyed = time.perf_counter(), 0, 0
    pacer = Pacer(args.rate)
    try:
        with tqdm(
            total=total, unit="msg", unit_scale=True, desc=f"produce {args.topic}", disable=args.no_progress
        ) as bar:
            for batch in batches:
                sink.send_many(batch)
                sent += len(batch)
                unkeyed += sum(1 for key, _ in batch if key is None)
                bar.update(len(batch))
                pacer.wait(sent)
            acked = sink.flush()
    finally:
        sink.close()
    seconds = time.perf_counter() - started
    partitions = topic_partitions(connection, args.topic)
    print(
        f"produce: {acked:,} messages acknowledged to {args.topic!r} "
        f"({'created' if created else 'existing'}, {partitions} partitions; {unkeyed:,} without a user_id key) "
        f"in {seconds:.1f} s ({acked / max(seconds, 1e-9):,.0f} msg/s)"
    )
    return 0
