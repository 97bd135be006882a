"""Replay a range of a Kafka topic through the features pipeline (Beam, batch).

--from and --to take an offset (the same in every partition), an ISO-8601
time with a timezone (or a date, meaning UTC midnight; resolved per partition
to the first message at or after it), or earliest / latest; --to is exclusive.
The range is fixed before the pipeline starts, split per partition (and into
pieces of at most --max-split messages) so that it reads in parallel, and fed
to the same steps as `python -m pipelines features`: the output equals a
features run over the same events from a file. Malformed messages become dead
letters whose source is kafka:<topic>/<partition>/<offset>.

Outputs: --output DIR (histories/, training_examples/, dead_letters/,
summary.json), or --to-topic T2 (one JSON history per user, key = user_id; the
Parquet snapshot then goes to a temporary folder unless --output is also
given). --dead-letter-topic also publishes the dead letters as JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
from typing import TYPE_CHECKING

from pipelines.cli import flags
from pipelines.cli.features import add_history_arguments, label_windows
from pipelines.errors import ConfigError

if TYPE_CHECKING:
    from pipelines.io.kafka.config import KafkaConnection

ACCEPTS_BEAM_ARGS = True
log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from pipelines.io.kafka.config import add_connection_arguments
    from pipelines.io.kafka.consume import BACKENDS

    parser.add_argument("--topic", required=True, help="topic to replay")
    parser.add_argument(
        "--from",
        dest="start",
        default="earliest",
        metavar="TIME|OFFSET",
        help="first offset or time (default: %(default)s)",
    )
    parser.add_argument(
        "--to",
        dest="stop",
        default="latest",
        metavar="TIME|OFFSET",
        help="end offset or time, exclusive (default: %(default)s)",
    )
    parser.add_argument("--partitions", metavar="P[,P...]", help="only these partitions (default: all)")
    flags.add_output(parser, "the features snapshot (Parquet)", required=False)
    parser.add_argument("--to-topic", metavar="TOPIC", help="publish the histories to this topic (JSON per user)")
    parser.add_argument("--dead-letter-topic", metavar="TOPIC", help="also publish the dead letters here")
    parser.add_argument(
        "--max-split",
        type=flags.positive(),
        default=500_000,
        help="at most this many messages per read split (default: %(default)s)",
    )
    parser.add_argument(
        "--kafka-backend",
        default="kafka-python",
        choices=BACKENDS,
        help="client library (default: %(default)s; confluent needs the kafka-fast extra)",
    )
    add_history_arguments(parser)
    add_connection_arguments(parser)
    flags.add_runner(parser)


def _partitions(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(p) for p in text.split(",") if p.strip()]
    except ValueError as exc:
        raise ConfigError("--partitions", f"got {text!r}", "pass partition numbers like 0,1,2") from exc


def _publish(
    connection: KafkaConnection, output: str, topic: str | None, dead_topic: str | None, partitions: int
) -> dict[str, int]:
    from pipelines.io.kafka.encode import dead_letters_to_json, histories_to_json
    from pipelines.io.kafka.produce import ensure_topic, open_sink
    from pipelines.io.parquet import read_table
    from pipelines.io.snapshot import DEAD_LETTERS, HISTORIES, open_snapshot
    from pipelines.schemas.layouts import DEAD_LETTER, HISTORY

    sent: dict[str, int] = {}
    snapshot = open_snapshot(output, flag="--output", writer="python -m pipelines replay")
    jobs = [
        (topic, snapshot.files(HISTORIES), HISTORY, histories_to_json),
        (dead_topic, snapshot.files(DEAD_LETTERS), DEAD_LETTER, dead_letters_to_json),
    ]
    for name, paths, layout, encode in jobs:
        if not name:
            continue
        ensure_topic(connection, name, partitions)
        sink = open_sink(connection, name)
        try:
            for path in paths:
                sink.send_many(encode(read_table(path, layout)))
            sent[name] = sink.flush()
        finally:
            sink.close()
    return sent


def run(args: argparse.Namespace) -> int:
    from pipelines.features.pipeline import FeaturesConfig, run_features
    from pipelines.features.sources import ReadEventsFromKafka
    from pipelines.io.kafka.config import connection_from_args
    from pipelines.io.kafka.consume import open_lookup
    from pipelines.io.kafka.ranges import Position, resolve_ranges, split_ranges
    from pipelines.runners import pipeline_options, runner_for

    logging.getLogger("kafka").setLevel(logging.WARNING)  # its INFO lines are per-connection noise
    if not args.output and not args.to_topic:
        raise ConfigError("--output", "no destination given", "pass --output DIR and/or --to-topic TOPIC")
    start, stop = Position.parse(args.start, "--from"), Position.parse(args.stop, "--to")
    connection = connection_from_args(args)
    options = pipeline_options(args, args.beam_args)
    lookup = open_lookup(connection)
    try:
        ranges = resolve_ranges(lookup, args.topic, start, stop, _partitions(args.partitions))
    finally:
        lookup.close()
    output = args.output or tempfile.mkdtemp(prefix="gem-replay-")
    config = FeaturesConfig(
        inputs=[f"kafka:{r.topic}/{r.partition}/{r.start}-{r.stop}" for r in ranges],
        output=output,
        previous=args.previous,
        max_history=args.max_history,
        num_shards=args.num_shards,
        windows=label_windows(args),
        overwrite=args.overwrite,
        max_future_ms=int(args.max_future * 1000),
    )
    source = ReadEventsFromKafka(
        connection,
        split_ranges(ranges, args.max_split),
        num_shards=args.num_shards,
        backend=args.kafka_backend,
        keep_buffers=True,  # this command owns its worker processes (GEM_KEEP_BUFFERS=0 opts out)
        max_time_ms=config.max_time_ms(),
    )
    log.info("replay: %s, %d message(s) in %d partition(s)", args.topic, sum(r.size for r in ranges), len(ranges))
    summary = run_features(config, options, runner_for(args), source)
    if summary.get("dry_run"):  # --runner DataflowRunner --dry_run=True: the job graph, nothing ran
        from pipelines.dataflow_job import dry_run_report

        print(dry_run_report(summary))
        return 0
    summary["published"] = _publish(connection, output, args.to_topic, args.dead_letter_topic, len(ranges))
    print(json.dumps(summary, indent=2))
    print(
        f"replay: {summary.get('records_in', 0)} messages from {args.topic!r} "
        f"[{args.start}, {args.stop}), {summary.get('events_valid', 0)} valid, "
        f"{summary.get('dead_letters', 0)} dead letters, {summary.get('histories', 0)} histories "
        f"in {summary['seconds']} s -> {output}"
        + "".join(f"; {n} messages to {t!r}" for t, n in summary["published"].items())
    )
    return 0
