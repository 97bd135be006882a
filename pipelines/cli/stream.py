"""Stream a Kafka topic into per-user histories (Beam streaming on Prism; state + timers).

Reads every partition of --topic from the consumer group's committed offsets
(--from, default earliest, when the group has none), keeps each user's history
in Beam keyed state, and --flush-interval after a user's first new event merges
them and writes the changed histories as Parquet flush files under
OUTPUT/histories/shard=NNNNN/ (and to
--to-topic as JSON, key = user_id). Offsets are committed to --group only after
what they carried is durable, so a restarted job (even after SIGKILL) loses
nothing and, deduplicating by event_id, counts nothing twice. Malformed messages
go to OUTPUT/dead_letters/ (and --dead-letter-topic). --idle-exit makes the job
finish once no message came for that long (tests, backfills).

A broker outage is ridden out for up to --broker-timeout (default 2m, as replay's reader):
the job retries, logging one line when the broker goes away and one when it is back;
longer, it fails (exit 2) and, restarted, resumes from its committed offsets.

One --output belongs to one --group and --topic: the first start records them (and the
topic's partition count) in OUTPUT/_stream.json, and every commit names the output. A
start that would resume an output from another output's commits, or with another group,
topic or partition count, is refused with the fix: a new output takes a new group.

With --model and --store, every flush also refreshes its users' representations in
the online store (user-level rows, and pair rows for users whose latest candidate
set in --candidates is recent) before their offsets are committed: a step of the
same graph, on Prism and on Flink. With --model and --rep-history N (a store is not needed),
every flush also appends the model's representation of each new event, as of that event, to
its user's row of historical representations under OUTPUT/rep_history/ (the newest N kept;
read like precompute --rep-history's backfill), before their offsets are committed.

With --candidates-topic (and --model, --store), the ranking funnel's candidate sets of --stage
are read beside the events and meet their user's state in the same graph: their pair
representations (on the user's history as the next flush would write it) go to --store before
their offsets are committed; sets past their needed_by are dropped and counted, pairs fresh in
the store skipped. --ad-catalog gives the candidate ads' advertiser and category.

SIGTERM stops the job cleanly (exit 0): on Prism the reads end and the graph drains (what was
read is written and committed; a second SIGTERM cancels), on Flink the job is cancelled.

--metrics-port serves Prometheus metrics (consumer lag per partition, events/s, dead
letters per reason, flush and refresh latencies, freshness, buffered events, users,
RSS); on a terminal a status line comes every 5 s.

Runs on Beam's Prism runner built by `make prism` (never downloaded at run time), or
with --runner FlinkRunner on a Flink cluster (`make flink-up`): the same graph, its
keyed state checkpointed by Flink (--checkpointing_interval, default 5000 ms;
the cluster's state backend), bundles end before each checkpoint (the command sets
--finish_bundle_before_checkpointing), offsets are committed when a checkpoint that
covers them completes, and --idle-exit cancels the job once the group has committed the
whole topic for that long.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import uuid
from typing import TYPE_CHECKING, Any

from pipelines import settings
from pipelines.cli import flags
from pipelines.errors import ConfigError

if TYPE_CHECKING:
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipelines.streaming.config import StreamConfig

ACCEPTS_BEAM_ARGS = True
#: Flink bundles of `stream` end after this many ms (the runner's streaming default is 1,000).
STREAM_BUNDLE_MS = 200
#: Prism's experiment that turns its dynamic bundle splits off (see _prism_options).
PRISM_NO_SPLITS = "prism_disable_sdf_split"


def add_arguments(parser: argparse.ArgumentParser, *, pairs: bool = False) -> None:
    """``stream``'s flags; with ``pairs`` (``solaris``), --candidates-topic, --model and --store are required."""
    flags.add_topic(parser, "topic of events")
    flags.add_group(parser)
    parser.add_argument(
        "--output",
        required=True,
        metavar="DIR",
        help="folder of the job's state: flush files and dead letters (a restarted job resumes from it)",
    )
    flags.add_start(parser, "where to start when the group has no committed offset")
    flags.add_topic_outputs(parser)
    flags.add_num_shards(parser, "the state keys")
    flags.add_max_history(parser)
    flags.add_setting_duration(
        parser,
        settings.FLUSH_INTERVAL,
        "how long a user's new events wait before their flush (0: each polled batch of them is merged as it "
        "arrives, no timer: the lowest latency, a busy user's events coalesce only within a poll)",
        zero_ok=True,
    )
    flags.add_duration(
        parser, "--idle-exit", None, "finish when no message arrived for this long; without it, run until stopped"
    )
    parser.add_argument(
        "--model",
        required=pairs,
        metavar="MODEL_DIR",
        help="refresh representations with this model (output folder of the train command)",
    )
    flags.add_store(parser, required=pairs, what=" for refreshed representations")
    parser.add_argument(
        "--candidates",
        nargs="+",
        default=(),
        metavar="PATH_OR_GLOB",
        help="candidate sets (CANDIDATES Parquet): also refresh each touched user's pair "
        "representations for their latest candidate set",
    )
    flags.add_setting_duration(
        parser,
        settings.CANDIDATE_TTL,
        "a candidate set is recent if requested at most this long before the user's last event",
    )
    _add_candidate_arguments(parser, required=pairs)
    flags.add_rep_history(
        parser, "appended as events arrive (only the new events go through --model; needs --model, not --store)"
    )
    flags.add_device(parser, "the representation refresh")
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="CPU threads of the refresh's inference: the reader, the flusher and the runner "
        "share the worker's cores (default: %(default)s)",
    )
    flags.add_max_future(parser)
    flags.add_duration(
        parser,
        "--broker-timeout",
        "2m",
        "ride out a Kafka outage this long (the job retries, logging when the broker goes and when it is "
        "back); longer, it fails",
    )
    flags.add_metrics_port(parser, "lag, rates, freshness")
    flags.add_kafka_connection(parser)
    group = parser.add_argument_group(
        "runner",
        "the job runs on Beam's Prism, or with --runner FlinkRunner --flink_master HOST:8081 on Flink; "
        "other Beam (and Flink runner) options in Beam's spelling go to Beam as given",
    )
    flags.beam_flag(group, "prism_location", metavar="PATH", help="Prism binary (Beam's option; default: make prism's)")


def _add_candidate_arguments(parser: argparse.ArgumentParser, *, required: bool) -> None:
    from pipelines.schemas.enums import FUNNEL_STAGES

    group = parser.add_argument_group(
        "candidate sets",
        "with --candidates-topic, the ranking funnel's candidate sets meet their user's state in the "
        "graph, and their pair representations go to --store before their offsets are committed",
    )
    group.add_argument(
        "--candidates-topic",
        required=required,
        metavar="TOPIC",
        default=None,
        help="topic of candidate sets (CANDIDATE_SET JSON, key = user_id), read beside --topic; needs --model "
        "and --store",
    )
    group.add_argument(
        "--stage", default="early", choices=FUNNEL_STAGES, help="funnel stage to precompute (default: %(default)s)"
    )
    flags.add_duration(
        group,  # type: ignore[arg-type]
        "--deadline-grace",
        None,
        "still compute a set this long after its needed_by; without it, a late set is dropped (and counted)",
    )
    flags.add_setting_duration(
        group,  # type: ignore[arg-type]
        settings.PAIR_MAX_AGE,
        "a stored pair younger than this, on the user's current history, is not computed again",
    )
    group.add_argument(
        "--ad-catalog",
        metavar="PARQUET",
        default=None,
        help="ads' advertiser and category (item_id, advertiser_id, item_category), looked up first for a "
        "candidate ad; without it, the ads the histories hold",
    )
    flags.add_encoding_cache(group)


def stream_config(args: argparse.Namespace, on_flink: bool) -> StreamConfig:
    """The one place a :class:`StreamConfig` is built from parsed flags."""
    from pipelines.streaming.config import StreamConfig

    return StreamConfig(
        topic=args.topic,
        output=args.output,
        group=args.group,
        num_shards=args.num_shards,
        max_history=args.max_history,
        flush_interval_s=args.flush_interval,
        idle_exit_s=args.idle_exit,
        histories_topic=args.to_topic,
        dead_letter_topic=args.dead_letter_topic,
        model=args.model,
        store=args.store,
        candidates=tuple(args.candidates),
        candidate_ttl_s=args.candidate_ttl,
        candidates_topic=args.candidates_topic,
        stage=args.stage,
        deadline_grace_s=args.deadline_grace or 0.0,
        pair_max_age_s=args.pair_max_age,
        ad_catalog=args.ad_catalog,
        encoding_cache=args.encoding_cache,
        encoding_max_age_s=args.encoding_max_age,
        rep_history=args.rep_history,
        device=args.device,
        torch_threads=args.torch_threads,
        max_future_s=args.max_future,
        broker_timeout_s=args.broker_timeout,
        checkpointed=on_flink,
    )


def _check_inputs(config: StreamConfig) -> None:
    """A bad store URI, an unreachable server or refused credentials, a missing or mismatched
    checkpoint, missing or foreign candidate files: all fail before any work, the files before the store
    is opened (an LMDB store is created on opening)."""
    if config.model:
        from pipelines.precompute.pipeline import load_model_flag

        load_model_flag(config.model)
    if config.candidates:
        from pipelines.streaming.refresh import load_recent_candidates

        load_recent_candidates(config.candidates, config.candidate_ttl_s)
    if config.ad_catalog:
        from pipelines.streaming.pairs import load_ad_catalog

        load_ad_catalog(config.ad_catalog)
    if config.store:
        from pipelines.store import check_store

        check_store(config.store)


def run(args: argparse.Namespace) -> int:
    import apache_beam as beam

    from pipelines.io.commit import writer_lock
    from pipelines.io.kafka.config import connection_from_args
    from pipelines.io.kafka.ranges import Position
    from pipelines.io.outputs import check_output, store_path
    from pipelines.streaming.job import build_stream, start_offsets
    from pipelines.streaming.lag import watch_stream

    # kafka-python logs every failed request of an outage (dozens of lines a second); the job's
    # broker watch (pipelines.io.kafka.outage) says it once when the broker goes and once when it is back.
    logging.getLogger("kafka").setLevel(logging.DEBUG if args.verbose else logging.CRITICAL)
    on_flink = _runner(args.beam_args) == "FlinkRunner"
    config = stream_config(args, on_flink)
    flags.check_port_free(args.metrics_port)
    options = _flink_options(args) if on_flink else _prism_options(args)
    _check_output(args.output)
    check_output(
        args.output,
        [
            ("--model", args.model),
            ("--store", store_path(args.store)),
            ("--ad-catalog", args.ad_catalog),
            *(("--candidates", c) for c in args.candidates),
        ],
    )
    _check_inputs(config)
    connection = connection_from_args(args)
    start = Position.parse(args.start, "--from")
    starts, commits = start_offsets(connection, args.topic, args.group, start)
    if config.candidates_topic is not None:  # its commits are the group's too; the output claims the events'
        starts += start_offsets(connection, config.candidates_topic, args.group, start)[0]
    logging.getLogger(__name__).info(
        "stream: %s from %s", args.topic, ", ".join(f"{s.partition}@{s.start}" for s in starts)
    )
    pairs = config.candidates_topic is not None
    stop_watching = watch_stream(connection, config.topics, args.group, args.metrics_port, pairs=pairs)
    try:
        with writer_lock(args.output):  # one job per --output; a dead one frees it
            config = _claim(config, len(commits), commits)
            p = beam.Pipeline(options=options)
            build_stream(p, connection, config, starts)
            _run(p, connection, config, args.idle_exit, on_flink)
    finally:
        stop_watching()
    ended = "stopped" if args.idle_exit is None else f"finished (idle for {args.idle_exit} s)"
    print(f"stream: {args.topic} {ended}; histories in {args.output}/histories")
    if pairs and not on_flink:  # on Flink the counts stay in the workers' processes
        print(_pairs_line(config.candidates_topic))
    return 0


def _pairs_line(topic: str | None) -> str:
    """The candidate sets' closing line, from this process's metrics (Prism's workers run here)."""
    from pipelines.streaming.metrics import PAIR_OUTCOMES, shared_metrics

    metrics = shared_metrics("stream")
    pairs = ", ".join(f"{metrics.value('gem_pairs_total', outcome=o):,.0f} {o}" for o in PAIR_OUTCOMES)
    return (
        f"solaris: {metrics.value('gem_records_total', kind='candidate_sets'):,.0f} candidate sets read from "
        f"{topic} ({metrics.value('gem_deadline_dropped_total'):,.0f} past their deadline); pairs: {pairs}"
    )


def _run(p: Any, connection: Any, config: StreamConfig, idle_exit: float | None, on_flink: bool) -> None:
    """Run the job until it is idle (--idle-exit) or stopped (SIGTERM, :func:`stopping_on_sigterm`); one
    whose broker stayed away past --broker-timeout fails with that error (its workers run in this
    process on Prism: the process's broker watch knows)."""
    from pipelines.io.kafka.outage import BrokerUnavailableError, broker_watch
    from pipelines.streaming.drive import run_on_prism, stopping_on_sigterm

    watch = broker_watch(connection, config.broker_timeout_s)
    try:
        with stopping_on_sigterm(drain=not on_flink):
            if on_flink:
                _run_on_flink(p, connection, config, idle_exit)
            else:
                run_on_prism(p)
    except Exception as exc:
        if watch.expired():
            raise BrokerUnavailableError(watch.expired_message()) from exc
        raise


def _claim(config: StreamConfig, partitions: int, commits: Any) -> StreamConfig:
    """The output, the group and the topic belong together (:mod:`pipelines.streaming.ownership`);
    the commits then name the output."""
    import dataclasses

    from pipelines.streaming.ownership import claim_output, commit_metadata
    from pipelines.streaming.state import has_flush_files

    owner = claim_output(
        config.output,
        config.topic,
        config.group,
        partitions,
        commits,
        holds_state=has_flush_files(config.output),
    )
    return dataclasses.replace(config, commit_metadata=commit_metadata(owner, config.output))


def _runner(beam_args: list[str]) -> str:
    from pipelines.runners import given_values

    runner = given_values(beam_args).get("runner") or "PrismRunner"
    if runner not in ("PrismRunner", "FlinkRunner"):
        raise ConfigError("--runner", f"stream runs on PrismRunner or FlinkRunner, got {runner}", "pick one of them")
    return runner


def _prism_options(args: argparse.Namespace) -> PipelineOptions:
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipelines.runners import JOB_SERVER_TIMEOUT, check_known, default_prism, merge_flags

    prism = args.prism_location or default_prism()
    if not prism:
        raise ConfigError(
            "--prism_location",
            "no Prism binary found",
            "build it with `make prism` (Beam would otherwise download it at run time)",
        )
    flags_ = merge_flags(
        args.beam_args,
        required={"runner": "PrismRunner", "streaming": None, "prism_location": prism},
        defaults={
            "environment_type": "LOOPBACK",
            # Prism 2.77's SDK state cache can serve stale state across bundles; with no cache
            # every state read (the commit ledger) goes to the runner.
            "max_cache_memory_usage_mb": "0",
            **JOB_SERVER_TIMEOUT,
        },
    )
    # Prism splits a bundle that makes no progress for a while, and a split of a bundle holding
    # timers loses them (apache/beam#35771, open; Prism logs "Unexpected split on a bundle with
    # timers"): the users' buffered events were then never flushed and their partition's commits
    # stalled. Prism's own switch turns its dynamic splits off. Experiments add up.
    flags_.append(f"--experiments={PRISM_NO_SPLITS}")
    options = PipelineOptions(flags_, save_main_session=False, pickle_library="cloudpickle")
    check_known(options, args.beam_args)
    return options


def _flink_options(args: argparse.Namespace) -> PipelineOptions:
    """FlinkRunner in streaming mode with checkpoints (they drive the offset commits), through the
    cluster's standing job server and worker pool when it offers them (see pipelines.jobservers)."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipelines import jobservers
    from pipelines.runners import JOB_SERVER_TIMEOUT, check_known, given_values, merge_flags, worker_paths

    beam_args = args.beam_args
    given = given_values(beam_args)
    if given.get("shutdown_sources_after_idle_ms") is not None:
        raise ConfigError(
            "--shutdown_sources_after_idle_ms",
            "finished sources make the portable Flink operators wait for timers forever",
            "drop it: --idle-exit ends the job",
        )
    if given.get("finish_bundle_before_checkpointing", None) is not None:  # a Beam switch: a value is refused
        raise ConfigError(
            "--finish_bundle_before_checkpointing",
            "the command sets this switch: without it a bundle still open at a checkpoint keeps its output "
            "until the operator's next bundle, which Create's one element never gets, and the job reads nothing",
            "drop it",
        )
    defaults = jobservers.default_options("FlinkRunner", given) | {
        "checkpointing_interval": "5000",
        # Flink holds a stage's output and its watermark until the bundle ends (streaming default:
        # 1,000 ms), and the flush timers wait on that watermark: 200 ms took freshness at 500
        # events/s from p50 9.6 s to 5.9 s (docs/benchmarks.md)
        "max_bundle_time_mills": str(STREAM_BUNDLE_MS),
        "job_name": f"gem-stream-{uuid.uuid4().hex[:12]}",  # so that the driver can cancel it by name
        **JOB_SERVER_TIMEOUT,
    }
    # finish_bundle_before_checkpointing: a bundle still open at a checkpoint would hold Create's one
    # output until a next bundle that never comes; operator_chaining (a switch that turns Flink's
    # chaining OFF): the operators' ids then do not depend on --parallelism, so a savepoint restores
    # at another one (docs/operations/flink.md)
    required = {
        "runner": "FlinkRunner",
        "streaming": None,
        "finish_bundle_before_checkpointing": None,
        "operator_chaining": None,
    }
    flags_ = merge_flags(beam_args, required=required, defaults=defaults)
    options = PipelineOptions(flags_, save_main_session=False, pickle_library="cloudpickle")
    check_known(options, beam_args, jobservers.FLINK_OPTIONS)
    interval = given_values(flags_).get("checkpointing_interval") or ""
    if not interval.isdigit() or int(interval) <= 0:
        raise ConfigError(
            "--checkpointing_interval",
            f"got {interval!r}",
            "pass milliseconds > 0: offsets are committed on checkpoints",
        )
    jobservers.validate_flink(options)
    jobservers.check_worker_paths(options, worker_paths(args))
    return options


def _run_on_flink(p: Any, connection: Any, config: Any, idle_exit: float | None) -> None:
    from apache_beam.options.pipeline_options import FlinkRunnerOptions, GoogleCloudOptions

    from pipelines.jobservers import EMBEDDED_FLINK, cancel_flink_job
    from pipelines.streaming.drive import run_until_idle

    master = p.options.view_as(FlinkRunnerOptions).flink_master or "[auto]"
    name = p.options.view_as(GoogleCloudOptions).job_name
    result = p.run()

    def cancel() -> None:
        if master not in EMBEDDED_FLINK:  # Beam's cancel leaves the cluster's job running
            cancel_flink_job(master, name)
        result.cancel()  # stops the job server and the LOOPBACK workers

    try:
        run_until_idle(result, connection, config.topics, config.group, idle_exit, cancel)
    except BaseException:  # a failed job, or ^C: never leave it running on the cluster
        with contextlib.suppress(Exception):
            cancel()
        raise


def _check_output(output: str) -> None:
    """A restarted job resumes its own flush files; a committed batch snapshot is never appended to."""
    from pipelines.io.commit import read_commit

    if read_commit(output) is not None:
        raise ConfigError(
            "--output",
            f"{output!r} holds a committed batch snapshot (features, replay, precompute or index)",
            "stream into a folder of its own; a restart passes the same streaming folder again",
        )
