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
from pipelines.cli.features import add_history_arguments, features_config
from pipelines.errors import ConfigError

if TYPE_CHECKING:
    from pipelines.io.kafka.config import KafkaConnection
    from pipelines.io.kafka.ranges import Position

ACCEPTS_BEAM_ARGS = True
log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    flags.add_topic(parser, "topic to replay")
    flags.add_start(parser, "first offset or time")
    parser.add_argument(
        "--to",
        dest="stop",
        default="latest",
        metavar="TIME|OFFSET",
        help="end offset or time, exclusive (default: %(default)s)",
    )
    parser.add_argument("--partitions", metavar="P[,P...]", help="only these partitions (default: all)")
    flags.add_output(parser, "the features snapshot (Parquet)", required=False)
    flags.add_topic_outputs(parser)
    parser.add_argument(
        "--max-split",
        type=flags.positive(),
        default=500_000,
        help="at most this many messages per read split (default: %(default)s)",
    )
    flags.add_kafka_backend(parser)
    add_history_arguments(parser)
    flags.add_kafka_connection(parser)
    flags.add_runner(parser)


def _partitions(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(p) for p in text.split(",") if p.strip()]
    except ValueError as exc:
        raise ConfigError("--partitions", f"got {text!r}", "pass partition numbers like 0,1,2") from exc


def _check_order(start: Position, stop: Position, start_text: str, stop_text: str) -> None:
    """Refuse a range whose end comes before its start (it would read nothing and look like success)."""
    rank = {"earliest": 0, "offset": 1, "time": 1, "latest": 2}
    inverted = rank[start.kind] > rank[stop.kind] or (start.kind == stop.kind and start.value > stop.value)
    if inverted and not (start.kind == "latest" and stop.kind == "latest"):
        raise ConfigError(
            "--to",
            f"--from {start_text} --to {stop_text} ends before it starts",
            "swap them: --from is the first offset or time, --to the exclusive end (e.g. --from earliest --to latest)",
        )


def _publish(
    connection: KafkaConnection, output: str, topic: str | None, dead_topic: str | None, partitions: int
) -> dict[str, int]:
    from pipelines.io.kafka.encode import dead_letters_to_json, histories_to_json
    from pipelines.io.kafka.produce import ensure_topic, open_sink
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
                sink.send_many(encode(snapshot.read_table(path, layout)))
            sent[name] = sink.flush()
        finally:
            sink.close()
    snapshot.release()
    return sent


def run(args: argparse.Namespace) -> int:
    from pipelines.features.pipeline import run_features
    from pipelines.features.sources import ReadEventsFromKafka
    from pipelines.io.kafka.config import connection_from_args
    from pipelines.io.kafka.consume import open_lookup
    from pipelines.io.kafka.ranges import Position, resolve_ranges, split_ranges
    from pipelines.runners import pipeline_options, runner_for

    logging.getLogger("kafka").setLevel(logging.WARNING)  # its INFO lines are per-connection noise
    if not args.output and not args.to_topic:
        raise ConfigError("--output", "no destination given", "pass --output DIR and/or --to-topic TOPIC")
    start, stop = Position.parse(args.start, "--from"), Position.parse(args.stop, "--to")
    _check_order(start, stop, args.start, args.stop)
    connection = connection_from_args(args)
    options = pipeline_options(args, args.beam_args)
    lookup = open_lookup(connection)
    try:
        ranges = resolve_ranges(lookup, args.topic, start, stop, _partitions(args.partitions))
    finally:
        lookup.close()
    output = args.output or tempfile.mkdtemp(prefix="gem-replay-")
    config = features_config(
        args, inputs=[f"kafka:{r.topic}/{r.partition}/{r.start}-{r.stop}" for r in ranges], output=output
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
