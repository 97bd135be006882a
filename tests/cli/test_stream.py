"""``stream``'s runner choice: Prism (worker state) or Flink (keyed state); misuse stops before any work."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.cli import main
from pipelines.streaming.config import StreamConfig


def _stream(tmp_path: Path, *runner: str) -> list[str]:
    return ["stream", "--topic", "t", "--group", "g", "--output", str(tmp_path / "out"), *runner]


@pytest.mark.parametrize(
    ("runner", "said"),
    [
        (["--runner", "SparkRunner"], "stream runs on PrismRunner or FlinkRunner"),
        (["--runner", "FlinkRunner", "--shutdown_sources_after_idle_ms", "0"], "wait for timers forever"),
        (["--runner", "FlinkRunner", "--finish_bundle_before_checkpointing=false"], "Create's one element"),
        (["--runner", "FlinkRunner", "--checkpointing_interval", "0"], "offsets are committed on checkpoints"),
        (["--runner", "FlinkRunner", "--checkpointing_interval", "-1"], "offsets are committed on checkpoints"),
        (
            ["--runner", "FlinkRunner", "--flink_master", "127.0.0.1:1", "--flink_job_server_jar", __file__],
            "make flink-up",
        ),
        (["--runner", "FlinkRunner", "--no_such_option", "1"], "--no_such_option"),
    ],
)
def test_a_misused_runner_stops_the_command_naming_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], runner: list[str], said: str
) -> None:
    assert main(_stream(tmp_path, *runner)) == 2
    assert said in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_checkpointed_state_allows_the_representation_refresh() -> None:
    config = StreamConfig(topic="t", output="o", group="g", checkpointed=True, model="m", store="lmdb:///tmp/s")
    assert config.checkpointed and config.refresh


@pytest.mark.parametrize("given", [[], ["--experiments=use_runner_v2"]])
def test_on_prism_the_stream_turns_prisms_bundle_splits_off(tmp_path: Path, given: list[str]) -> None:
    """A split of a bundle with timers loses them (apache/beam#35771): the switch is there whatever
    experiments the user adds."""
    from pipelines.cli import build_parser
    from pipelines.cli.stream import PRISM_NO_SPLITS, _prism_options

    argv = [*_stream(tmp_path), "--prism_location", __file__, *given]
    args, extra = build_parser(argv).parse_known_args(argv)
    args.beam_args = extra
    experiments = _prism_options(args).get_all_options()["experiments"]
    assert PRISM_NO_SPLITS in experiments and all(e.split("=")[-1] in experiments for e in given)
