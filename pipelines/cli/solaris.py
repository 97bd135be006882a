"""Precompute (user, ad) pair representations as the ranking funnel narrows its candidates.

A thin entry to the streaming graph: `solaris` is `stream --candidates-topic` (the same
flags: see `stream --help`), with --candidates-topic, --model and --store required. The
candidate sets of --stage (default early: ~200 ads, tens to hundreds of ms before the late
stage needs them) are read from --candidates-topic beside the events
of --topic, keyed by user, and meet that user's history in the graph's keyed state (as the
next flush would write it: flushed events and those still buffered). Their pair
representations are computed there by RunInference, earliest `needed_by` first, and written
to --store before the sets' offsets are committed. Pairs already fresh in the store (same
model version, same history, younger than --pair-max-age) are skipped; sets past their
`needed_by` are dropped; both are counted in the metrics (--metrics-port).

No process holds every user's history: on Prism (the default, a local runner) the state is
the runner's, on Flink (--runner FlinkRunner) the engine's keyed state, checkpointed.
"""

from __future__ import annotations

import argparse

from pipelines.cli import stream

ACCEPTS_BEAM_ARGS = stream.ACCEPTS_BEAM_ARGS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    stream.add_arguments(parser, pairs=True)


def run(args: argparse.Namespace) -> int:
    return stream.run(args)
