"""The one flag vocabulary every command shares (after ``feast/cli/cli_options.py``).

- ``--features DIR``: a folder written by ``features`` (or ``replay``), read by ``train``,
  ``precompute``, ``evaluate-fallback``;
- ``--model MODEL_DIR``: a folder written by ``train``;
- ``--output``: what a command writes, always with ``--overwrite`` (a writer never replaces
  an earlier output silently); inputs and outputs never share a name;
- ``--device {auto,cpu,cuda}``: wherever a model or an index runs;
- durations (ages, windows, intervals, TTLs) in one syntax: ``90s``, ``15m``, ``2h``, ``7d``
  (:func:`pipelines.durations.parse_duration`);
- the runner group: ``--runner`` plus Beam's own options in Beam's own spelling
  (``--direct_running_mode``, ``--direct_num_workers``, ``--prism_location``,
  ``--flink_master``, ...), which reach Beam exactly as given (:mod:`pipelines.runners`).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from typing import Any

from pipelines import settings
from pipelines.durations import parse_duration
from pipelines.errors import ConfigError

__all__ = [
    "DEVICES",
    "add_device",
    "add_duration",
    "add_features_input",
    "add_max_future",
    "add_model_input",
    "add_output",
    "add_progress",
    "add_runner",
    "add_seed",
    "add_skip_bad_files",
    "duration",
]

DEVICES = ("auto", "cpu", "cuda")
LOCAL_RUNNERS = ("DirectRunner", "local")
REMOTE_RUNNERS = ("FlinkRunner", "SparkRunner", "PrismRunner", "DataflowRunner", "PortableRunner")
RUNNING_MODES = ("in_memory", "multi_threading", "multi_processing")


def duration(text: str) -> float:
    """An argparse ``type``: seconds in ``text`` (``90s``, ``15m``, ``2h``, ``7d``; a bare number is seconds)."""
    seconds = duration_or_zero(text)
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive duration; write e.g. 90s, 15m, 2h or 7d")
    return seconds


def duration_or_zero(text: str) -> float:
    """An argparse ``type``: as :func:`duration`, and 0 accepted (a flag where 0 means "at once")."""
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def add_duration(
    parser: argparse.ArgumentParser, flag: str, default: str | None, help: str, *, zero_ok: bool = False
) -> None:
    """A duration flag: ``default`` in the same syntax (``"30m"``), or None for no default; ``zero_ok``
    accepts 0 too."""
    shown = default if default is not None else "none"
    parser.add_argument(
        flag,
        type=duration_or_zero if zero_ok else duration,
        default=None if default is None else parse_duration(default),
        metavar="DURATION",
        help=f"{help} (default: {shown})",
    )


def add_setting_duration(
    parser: argparse.ArgumentParser, setting: settings.Duration, help: str, *, zero_ok: bool = False
) -> None:
    """A duration flag whose name and default come from :mod:`pipelines.settings`."""
    add_duration(parser, setting.flag, setting.default, help, zero_ok=zero_ok)


def in_range(setting: settings.Range, kind: Callable[[str], Any] = int) -> Callable[[str], Any]:
    """An argparse ``type``: a number of ``kind`` that ``setting`` accepts (its one bound check)."""

    def parse(text: str) -> Any:
        try:
            return setting.check(kind(text))
        except (ValueError, ConfigError) as exc:
            raise argparse.ArgumentTypeError(f"{text!r}: pass a number in {setting.low}..{setting.high}") from exc

    return parse


def add_bounded(parser: Any, setting: settings.Bounded, help: str) -> None:
    """An integer flag whose name, default and bounds come from :mod:`pipelines.settings`; the config
    it reaches checks the bounds (one check, the same message from the CLI and from code)."""
    parser.add_argument(
        setting.flag,
        type=int,
        default=setting.default,
        metavar="N",
        help=f"{help} ({setting.low}..{setting.high}; default: %(default)s)",
    )


def add_max_history(parser: argparse.ArgumentParser) -> None:
    add_bounded(parser, settings.MAX_HISTORY, "events kept per user; older ones fold into the summary")


def add_rep_history(parser: argparse.ArgumentParser, how: str) -> None:
    """``--rep-history N``: LoopFM's historical representations of each user's newest N events."""
    parser.add_argument(
        "--rep-history",
        type=int,
        default=0,
        metavar="N",
        help="also write OUTPUT/rep_history/: the model's representation of each user's newest N events, each as "
        f"of its event (LoopFM's historical representations, a downstream ranker's sequence feature), {how} "
        "(default: off)",
    )


def add_encoding_cache(parser: Any) -> None:
    """``--encoding-cache N`` and ``--encoding-max-age``: the user-side encodings a pairs worker reuses."""
    add_bounded(
        parser,
        settings.ENCODING_CACHE,
        "users whose history encoding is kept for their next candidate set, reused while the history's tokens "
        "are unchanged (exact; 0: every set encodes its history)",
    )
    add_setting_duration(parser, settings.ENCODING_MAX_AGE, "a kept encoding is dropped after this long")


def add_num_shards(parser: argparse.ArgumentParser, what: str) -> None:
    add_bounded(parser, settings.NUM_SHARDS, f"user shards: {what}")


def add_max_future(parser: argparse.ArgumentParser) -> None:
    add_setting_duration(
        parser,
        settings.MAX_FUTURE,
        "events later than the run's clock plus this become `future_time` dead letters, so no event moves a "
        "watermark past now",
    )


def add_skip_bad_files(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--skip-bad-files",
        action="store_true",
        help="record a file that cannot be read (truncated or non-gzip .gz, not Parquet, a schema the "
        "layouts cannot take) in the summary and as an `unreadable_file` dead letter, and go on; "
        "without it such a file stops the run with an error naming it",
    )


def add_features_input(parser: argparse.ArgumentParser, *, required: bool = True, what: str = "") -> None:
    parser.add_argument(
        "--features",
        required=required,
        metavar="DIR",
        help=f"a features snapshot: the --output folder of `features` or `replay`{what}",
    )


def add_model_input(parser: argparse.ArgumentParser, *, required: bool = True, what: str = "") -> None:
    parser.add_argument(
        "--model", required=required, metavar="MODEL_DIR", help=f"a trained model: the --output folder of `train`{what}"
    )


def add_output(
    parser: argparse.ArgumentParser, holds: str, *, metavar: str = "DIR", required: bool = True, **kwargs: Any
) -> None:
    """``--output`` and ``--overwrite`` together: ``holds`` says what the output is."""
    parser.add_argument("--output", required=required, metavar=metavar, help=f"where to write {holds}", **kwargs)
    parser.add_argument(
        "--overwrite", action="store_true", help=f"replace {holds} already at --output (refused without it)"
    )


def add_device(parser: argparse.ArgumentParser, what: str = "the model", default: str = "auto", why: str = "") -> None:
    parser.add_argument(
        "--device",
        default=default,
        choices=DEVICES,
        help=f"where {what} runs: auto = CUDA when a GPU is visible, else the CPU (default: %(default)s{why})",
    )


def add_seed(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--seed", type=int, default=0, help=f"seed of {what}; same seed, same result (default: 0)")


def add_progress(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")


class _BeamFlag(argparse.Action):
    """A Beam option accepted in Beam's spelling and in kebab-case; giving both with different
    values stops the command (argparse would otherwise keep the last one silently)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        seen: dict[str, tuple[str, Any]] = namespace.__dict__.setdefault("_beam_flags_seen", {})
        earlier = seen.get(self.dest)
        if earlier is not None and earlier[1] != values:
            parser.error(
                f"{earlier[0]} {earlier[1]} and {option_string} {values} set the same Beam option; give it once"
            )
        seen[self.dest] = (option_string or self.dest, values)
        setattr(namespace, self.dest, values)


def beam_flag(group: Any, name: str, **kwargs: Any) -> None:
    """Declare Beam's option ``--name`` (and its kebab-case alias) so ``--help`` lists it."""
    kebab = "--" + name.replace("_", "-")
    group.add_argument(f"--{name}", kebab, dest=name, action=_BeamFlag, default=None, **kwargs)


def add_runner(
    parser: argparse.ArgumentParser,
    *,
    runners: Sequence[str] = LOCAL_RUNNERS + REMOTE_RUNNERS,
    default: str = "DirectRunner",
) -> None:
    """The runner group. Beam options declared here, and any other ``--flag`` of Beam's
    (``--flink_master``, ``--environment_type``, ...), go to Beam as given."""
    group = parser.add_argument_group(
        "runner",
        "Beam pipeline options in Beam's spelling (e.g. --flink_master, --environment_type) go to Beam as "
        "given; an unknown flag stops the command",
    )
    group.add_argument("--runner", default=default, choices=tuple(runners), help="Beam runner (default: %(default)s)")
    beam_flag(
        group,
        "direct_running_mode",
        choices=RUNNING_MODES,
        help="how the local runner executes bundles (Beam's option; default: in_memory)",
    )
    beam_flag(
        group,
        "direct_num_workers",
        type=int,
        metavar="N",
        help="workers of multi_threading / multi_processing (Beam's option; default: 1)",
    )
    beam_flag(group, "prism_location", metavar="PATH", help="Prism binary (Beam's option; default: make prism's)")


def positive(kind: Callable[[str], Any] = int, *, zero: bool = False) -> Callable[[str], Any]:
    """An argparse ``type`` for a finite positive number of ``kind`` (``zero``: 0 allowed too)."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from exc
        if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
            raise argparse.ArgumentTypeError(f"{text!r} is not a {'non-negative' if zero else 'positive'} number")
        return value

    return parse


# -- the Kafka and long-running-job group of produce, replay, stream and solaris --------------------


def add_topic(parser: argparse.ArgumentParser, holds: str) -> None:
    parser.add_argument("--topic", required=True, help=holds)


def add_group(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--group", required=True, help="consumer group whose offsets the job commits")


def add_start(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--from", dest="start", default="earliest", metavar="TIME|OFFSET", help=f"{what} (default: %(default)s)"
    )


def add_topic_outputs(parser: argparse.ArgumentParser) -> None:
    """``--to-topic`` (histories as JSON, key = user_id) and ``--dead-letter-topic``."""
    parser.add_argument("--to-topic", metavar="TOPIC", help="also publish the histories here (JSON per user)")
    parser.add_argument("--dead-letter-topic", metavar="TOPIC", help="also publish the dead letters here (JSON)")


def add_kafka_backend(parser: argparse.ArgumentParser) -> None:
    from pipelines.io.kafka.consume import BACKENDS

    parser.add_argument(
        "--kafka-backend",
        default="kafka-python",
        choices=BACKENDS,
        help="client library (default: %(default)s; confluent needs the kafka-fast extra)",
    )


def add_kafka_connection(parser: argparse.ArgumentParser) -> None:
    """``--bootstrap-servers``, ``--security-protocol``, ``--sasl-*``, ``--ssl-*`` (GEM_KAFKA_* defaults)."""
    from pipelines.io.kafka.config import add_connection_arguments

    add_connection_arguments(parser)


def add_store(parser: argparse.ArgumentParser, *, required: bool, what: str = "") -> None:
    parser.add_argument(
        "--store",
        required=required,
        metavar="URI",
        help=f"online store{what}: lmdb:///path, redis://host:port/db, redis-cluster://host:port or "
        "package.module:Class://...",
    )


def add_metrics_port(parser: argparse.ArgumentParser, serves: str) -> None:
    parser.add_argument(
        settings.PORT.flag,
        type=in_range(settings.PORT),
        default=None,
        metavar="PORT",
        help=f"serve Prometheus metrics ({serves}) on 127.0.0.1:PORT ({settings.PORT.low}..{settings.PORT.high})",
    )


def check_port_free(port: int | None, host: str = "127.0.0.1") -> None:
    """Refuse, before any work, a ``--metrics-port`` that another process already holds."""
    import errno
    import socket

    if port is None:
        return
    with socket.socket() as probe:
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ConfigError(
                    settings.PORT.flag,
                    f"port {port} is in use on {host}",
                    "pick a free port, or stop the process that holds it (`ss -ltnp`)",
                ) from exc
            raise ConfigError(
                settings.PORT.flag, f"cannot listen on {host}:{port} ({exc.strerror})", "pick another port"
            ) from exc
