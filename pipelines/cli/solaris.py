"""Precompute (user, ad) pair representations as the ranking funnel narrows its candidates.

Reads candidate sets (CANDIDATE_SET JSON, e.g. `produce --input FUNNEL.parquet`) from
--topic, from the group's committed offsets (the start of the topic when it has none).
For every set at --stage (default early: ~200 ads, tens to hundreds of ms before the
late stage needs them) it computes the pairs with --model on the user's latest
history (--histories: the --output folder of `stream`, followed as it flushes, or of
`features`), each request's history encoded once, and writes them to --store before
committing the offset. Pairs already fresh in the store (computed by the same
model version on the user's current history, younger than --pair-max-age) are
skipped: after a model swap every pair is computed again; sets whose `needed_by` has
passed are dropped, not computed late; when more sets wait than --queue-size, the
oldest are shed. All three are counted in the metrics (--metrics-port) and the
closing line. A restarted job (even after SIGKILL) resumes from the committed offsets
and writes every pair once.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from types import FrameType
from typing import TYPE_CHECKING

from pipelines import settings
from pipelines.cli import flags

if TYPE_CHECKING:
    from pipelines.streaming.metrics import JobMetrics, Rates

ACCEPTS_BEAM_ARGS = False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from pipelines.schemas.enums import FUNNEL_STAGES

    flags.add_topic(parser, "topic of candidate sets")
    flags.add_group(parser)
    parser.add_argument("--histories", required=True, metavar="DIR", help="--output folder of `stream` or `features`")
    flags.add_model_input(parser)
    flags.add_store(parser, required=True)
    parser.add_argument(
        "--stage", default="early", choices=FUNNEL_STAGES, help="funnel stage to precompute (default: %(default)s)"
    )
    parser.add_argument("--batch-requests", type=int, default=8, help="candidate sets per batch (default: %(default)s)")
    parser.add_argument(
        "--queue-size", type=int, default=2_000, help="sets waiting at most; the oldest are shed (default: %(default)s)"
    )
    flags.add_duration(
        parser,
        "--deadline-grace",
        None,
        "still compute a set this long after its needed_by; without it, none (a large value such as 3650d "
        "replays old funnel files)",
    )
    flags.add_setting_duration(
        parser,
        settings.PAIR_MAX_AGE,
        "a stored pair younger than this, on the user's current history, is not computed again",
    )
    flags.add_encoding_cache(parser)
    flags.add_duration(
        parser,
        "--idle-exit",
        None,
        "finish when no message came for this long and all is committed; without it, run until stopped",
    )
    parser.add_argument(
        "--dead-letters",
        metavar="DIR",
        default=None,
        help="write unreadable candidate sets to DIR/dead_letters/ (DEAD_LETTER Parquet); always counted and logged",
    )
    flags.add_metrics_port(parser, "sets, pairs, lag, queue depth, exact share")
    flags.add_device(parser, "the pair inference", default="cpu", why="; the GIL-bound job keeps its cores")
    parser.add_argument("--torch-threads", type=int, default=1, help="CPU threads of inference (default: %(default)s)")
    flags.add_kafka_connection(parser)


def run(args: argparse.Namespace) -> int:
    from pipelines.io.kafka.config import connection_from_args
    from pipelines.io.kafka.consume import open_lookup
    from pipelines.precompute.pipeline import load_model_flag
    from pipelines.store import open_store
    from pipelines.streaming.candidates import CandidatesConfig, CandidatesJob
    from pipelines.streaming.history_view import check_histories
    from pipelines.streaming.metrics import JobMetrics, Rates, StatusLine

    logging.getLogger("kafka").setLevel(logging.WARNING)
    config = CandidatesConfig(
        topic=args.topic,
        group=args.group,
        histories=args.histories,
        model=args.model,
        store=args.store,
        stage=args.stage,
        batch_requests=args.batch_requests,
        queue_size=args.queue_size,
        deadline_grace_s=args.deadline_grace or 0.0,
        pair_max_age_s=args.pair_max_age,
        encoding_cache=args.encoding_cache,
        encoding_max_age_s=args.encoding_max_age,
        idle_exit_s=args.idle_exit,
        device=args.device,
        torch_threads=args.torch_threads,
        dead_letters=args.dead_letters,
    )
    flags.check_port_free(args.metrics_port)
    check_histories(config.histories)  # every input is checked before the store is opened (or created)
    load_model_flag(config.model)
    open_store(config.store).close()  # a bad URI or an unreachable server fails before any work
    connection = connection_from_args(args)
    open_lookup(connection).close()  # so do an unreachable broker and refused credentials
    metrics = JobMetrics("solaris")
    if args.metrics_port is not None:
        metrics.serve(args.metrics_port)
    job = CandidatesJob(connection, config, metrics)

    def stop(_signum: int, _frame: FrameType | None) -> None:
        job.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    rates = Rates(metrics)
    status = StatusLine(lambda seconds: _status(metrics, rates, seconds))
    status.start()
    counts = job.run()
    status.stopped.set()
    print(
        f"solaris: {counts.requests_done:,} candidate sets done ({counts.pairs_computed:,} pairs computed, "
        f"{counts.pairs_fresh:,} fresh in the store = compute saved, {counts.pairs_repeated:,} repeated); "
        f"{counts.deadline_dropped:,} sets past their deadline (and {counts.pairs_late:,} pairs of sets that "
        f"passed it mid-way), {counts.shed:,} shed, {counts.dead_letters:,} dead "
        f"letters, {counts.other_stage:,} of other stages; committed {counts.committed}",
        file=sys.stdout,
    )
    return 0


def _status(metrics: JobMetrics, rates: Rates, seconds: float) -> str:
    return (
        f"solaris: {rates.rate(seconds, 'gem_records_total'):.1f} sets/s, "
        f"{rates.rate(seconds, 'gem_pairs_total', outcome='computed'):.0f} pairs/s, "
        f"lag {metrics.value('gem_consumer_lag_messages'):.0f} msgs "
        f"({metrics.value('gem_consumer_lag_seconds'):.1f} s summed), "
        f"p99 set->pair {metrics.p99('candidate_to_pair'):.2f} s, queue {metrics.value('gem_queue_depth'):.0f}, "
        f"shed {metrics.value('gem_work_shed_total'):.0f}, late {metrics.value('gem_deadline_dropped_total'):.0f}"
    )
