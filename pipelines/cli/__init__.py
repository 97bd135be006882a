"""``python -m pipelines <command>``: one sub-command per stage.

Each command lives in its own module exposing ``add_arguments(parser)`` and
``run(args) -> int``; :data:`COMMANDS` maps the command name to that module, and
the module is imported only when its command runs (so ``generate`` never pays
for importing torch).
"""

from __future__ import annotations

import argparse
import faulthandler
import importlib
import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import NoReturn

from pipelines import harness_logs, redact, secrets
from pipelines.cli import failures
from pipelines.errors import PipelinesError

#: command name -> (module path, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "generate": ("pipelines.cli.generate", "generate a synthetic engagement world (events + ground truth)"),
    "features": ("pipelines.cli.features", "build per-user histories and training examples (Beam, batch)"),
    "train": ("pipelines.cli.train", "train the GEM-style model and its baseline; write model.pt + metrics.json"),
    "precompute": ("pipelines.cli.precompute", "precompute user and (user, ad) representations (Beam, RunInference)"),
    "inspect": ("pipelines.cli.inspect", "summarise any Parquet output of this project"),
    "index": ("pipelines.cli.index", "build a FAISS index of user representations (Beam, sharded)"),
    "lookup": ("pipelines.cli.lookup", "resolve (user, ads) to representations with fallbacks"),
    "evaluate-fallback": ("pipelines.cli.evaluate_fallback", "measure the fallback paths on a generated world"),
    "produce": ("pipelines.cli.produce", "load a generator events file into a Kafka topic (JSON, key = user_id)"),
    "replay": ("pipelines.cli.replay", "run the features pipeline over a Kafka topic range (Beam, batch)"),
    "stream": ("pipelines.cli.stream", "stream a Kafka topic into per-user histories (Beam on Prism, state)"),
    "solaris": ("pipelines.cli.solaris", "stream --candidates-topic: pair representations as the funnel narrows"),
    "transfer": ("pipelines.cli.transfer", "measure downstream rankers with representations vs distillation vs alone"),
}


class _QuietOptionalGcp(logging.Filter):
    """Drop Beam's notes that say nothing to a user of this project: optional Google Cloud clients we
    do not use, and RunInference's note that it could not read the process's memory usage."""

    NOISE = (
        "apitools not found",
        "No module named google.cloud.bigquery_storage_v1",
        "Resource module is not available for current platform",
    )

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.NOISE)


class _Parser(argparse.ArgumentParser):
    """argparse, with every usage error ending in the fix, like the project's own errors."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}. Fix: see `{self.prog} --help`\n")


def configure_logging(verbose: bool) -> None:
    """The project's own progress at INFO; libraries (Beam, kafka-python, ...) only from WARNING,
    unless ``-v``, which shows everything at DEBUG."""
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")  # no-op if configured
    logging.getLogger().setLevel(logging.DEBUG if verbose else logging.WARNING)
    logging.getLogger("pipelines").setLevel(logging.DEBUG if verbose else logging.INFO)
    for name in ("", "apache_beam.io.gcp.bigquery"):
        logging.getLogger(name).addFilter(_QuietOptionalGcp())


class _NoTracebackForOwnErrors(logging.Filter):
    """Beam logs a failing step's exception with its traceback; for the project's own errors
    and the known failure classes (which name the fix) the one-line ``error:`` that :func:`main`
    prints is the whole story."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return exc is None or not (isinstance(exc, PipelinesError) or failures.is_known(exc))


def _chosen(argv: Sequence[str]) -> str | None:
    return next((a for a in argv if not a.startswith("-")), None)


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The parser; only the chosen command's module is imported (to add its flags)."""
    invoked = os.path.basename(sys.argv[0])
    parser = _Parser(
        prog=invoked if invoked == "gem-pipelines" else "python -m pipelines",
        description="GEM feature and representation pipelines.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    chosen = _chosen(argv)
    for name, (module_path, help_text) in COMMANDS.items():
        if name != chosen:
            sub.add_parser(name, help=help_text)
            continue
        module = importlib.import_module(module_path)
        command = sub.add_parser(
            name, help=help_text, description=module.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
        )
        module.add_arguments(command)
        command.set_defaults(_module=module)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    _dump_stacks_on_sigusr1()
    for name in ("", "apache_beam.io.gcp.bigquery"):
        logging.getLogger(name).addFilter(_QuietOptionalGcp())
    logging.getLogger("apache_beam.runners.common").addFilter(_NoTracebackForOwnErrors())
    harness_logs.install()  # a LOOPBACK job's end is no traceback
    parser = build_parser(argv)
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args._module, "ACCEPTS_BEAM_ARGS", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.beam_args = extra
    if getattr(args, "runner", None) not in (None, "DirectRunner", "local"):
        from pipelines.runners import absolute_paths

        absolute_paths(args)  # a cluster's workers run in another directory
    configure_logging(args.verbose)
    redact.install()  # stdout, stderr and every log record: no password is ever printed
    try:
        with secrets.scoped():
            if hasattr(args, "store"):  # workers read the Redis password from the environment, not the URI
                args.store = secrets.move_store_password(args.store)
            return int(args._module.run(args))
    except PipelinesError as exc:
        print(f"error: {failures.with_fix(exc)}", file=sys.stderr)
        return 2
    except Exception as exc:  # the known failure classes end in one line; anything else is a bug
        kafka = getattr(args, "bootstrap_servers", None)
        message = failures.explain(exc, written=_written(args), stores=_stores(args), ports=_ports(args), kafka=kafka)
        if message is None:
            raise
        print(f"error: {message}", file=sys.stderr)
        return 2


def _dump_stacks_on_sigusr1() -> None:
    """``kill -USR1 PID`` prints every thread's stack to stderr: where a run that seems stuck is.
    Only where stderr is a real file (not a test's captured stream, which has no descriptor)."""
    if not hasattr(signal, "SIGUSR1"):
        return
    try:
        sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return
    faulthandler.register(signal.SIGUSR1, all_threads=True)


def _written(args: argparse.Namespace) -> list[str]:
    """What the command writes, named when a failure does not carry its file name."""
    paths = [getattr(args, name, None) for name in ("output", "dead_letters", "plot", "html")]
    return [p for p in paths if isinstance(p, str) and p]


def _stores(args: argparse.Namespace) -> list[str]:
    """The folder of an LMDB ``--store`` (LMDB's own errors carry no file name)."""
    store = getattr(args, "store", None)
    if isinstance(store, str) and store.startswith("lmdb://"):
        return [store.removeprefix("lmdb://").split("?")[0]]
    return []


def _ports(args: argparse.Namespace) -> list[int]:
    port = getattr(args, "metrics_port", None)
    return [port] if isinstance(port, int) else []
