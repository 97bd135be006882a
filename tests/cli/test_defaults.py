"""One vocabulary, one default: every default is defined once (pipelines/settings.py) and checked
once; a parser default equals its config's default; the shared flag groups live in cli/flags.py."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from pipelines import settings
from pipelines.cli import build_parser, main
from pipelines.cli.features import features_config
from pipelines.cli.stream import stream_config
from pipelines.errors import ConfigError
from pipelines.features.pipeline import FeaturesConfig
from pipelines.similarity.policy import ResolverConfig
from pipelines.streaming.config import StreamConfig

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "pipelines"

#: Config fields (and keyword parameters) whose default must come from pipelines.settings, never a literal.
SETTING_FIELDS = {
    "max_history",
    "num_shards",
    "flush_interval_s",
    "candidate_ttl_s",
    "max_future_s",
    "max_future_ms",
    "pair_max_age_s",
    "click_ms",
    "conversion_ms",
    "max_age_s",
    "fallback_max_age_s",
    "encoding_cache",
    "encoding_max_age_s",
}
#: Flags that only cli/flags.py declares (each command calls its helper).
SHARED_FLAGS = {
    "--topic",
    "--group",
    "--from",
    "--to-topic",
    "--dead-letter-topic",
    "--kafka-backend",
    "--metrics-port",
    "--store",
    "--max-history",
    "--num-shards",
    "--bootstrap-servers",
    "--encoding-cache",
    "--encoding-max-age",
}


def _parse(*argv: str) -> Any:
    return build_parser(list(argv)).parse_known_args(list(argv))[0]


def _defaults(cls: type) -> dict[str, Any]:
    return {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}


def test_a_features_config_from_default_flags_equals_the_dataclass_defaults() -> None:
    args = _parse("features", "--input", "e.jsonl", "--output", "out")
    built, plain = features_config(args, inputs=["e.jsonl"], output="out"), FeaturesConfig(["e.jsonl"], "out")
    assert dataclasses.replace(built, clock=plain.clock) == plain


def test_replay_builds_its_features_config_with_the_same_helper() -> None:
    args = _parse("replay", "--topic", "t", "--output", "out")
    built = features_config(args, inputs=["kafka:t/0/0-1"], output="out")
    assert dataclasses.replace(built, clock=FeaturesConfig.clock) == FeaturesConfig(["kafka:t/0/0-1"], "out")


def test_a_stream_config_from_default_flags_equals_the_dataclass_defaults() -> None:
    args = _parse("stream", "--topic", "t", "--group", "g", "--output", "out")
    built = stream_config(args, on_flink=False)
    plain = StreamConfig(topic="t", output="out", group="g")
    assert dataclasses.replace(built, clock=plain.clock) == plain


def test_solaris_and_lookup_defaults_equal_their_configs() -> None:
    solaris = _parse(
        "solaris", "--topic", "t", "--candidates-topic", "c", "--group", "g", "--output", "o", "--model", "m",
        "--store", "lmdb:///s",
    )  # fmt: skip
    built = stream_config(solaris, on_flink=False)
    plain = StreamConfig(topic="t", output="o", group="g", model="m", store="lmdb:///s", candidates_topic="c")
    assert dataclasses.replace(built, clock=plain.clock) == plain
    assert solaris.pair_max_age == settings.PAIR_MAX_AGE.seconds
    from pipelines.cli.lookup import DEFAULT_FALLBACK_MAX_AGE_S, DEFAULT_MAX_AGE_S

    assert (DEFAULT_MAX_AGE_S, DEFAULT_FALLBACK_MAX_AGE_S) == (
        _defaults(ResolverConfig)["max_age_s"],
        _defaults(ResolverConfig)["fallback_max_age_s"],
    )


@pytest.mark.parametrize("value", [0, -1, settings.MAX_HISTORY.high + 1])
def test_max_history_has_one_bound_check_everywhere(value: int) -> None:
    """Features, stream, the Beam transform and the pure build refuse the same values with the same message."""
    from pipelines.features.histories import build_histories
    from pipelines.features.transforms import BuildHistories

    messages = set()
    for make in (
        lambda: FeaturesConfig(["e.jsonl"], "out", max_history=value),
        lambda: StreamConfig(topic="t", output="out", group="g", max_history=value),
        lambda: BuildHistories("out", None, max_history=value),  # type: ignore[arg-type]
        lambda: build_histories(None, None, max_history=value),
    ):
        with pytest.raises(ConfigError) as caught:
            make()
        messages.add(str(caught.value))
    assert messages == {f"--max-history: got {value}. Fix: pass a number in 1..{settings.MAX_HISTORY.high}"}


@pytest.mark.parametrize("command", ["features", "stream"])
def test_the_cli_refuses_max_history_with_the_same_check(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = {
        "features": ["features", "--input", str(tmp_path / "e.jsonl"), "--output", str(tmp_path / "o")],
        "stream": ["stream", "--topic", "t", "--group", "g", "--output", str(tmp_path / "o")],
    }[command]
    assert main([*argv, "--max-history", "0"]) == 2
    assert capsys.readouterr().err.strip().endswith("--max-history: got 0. Fix: pass a number in 1..1048576")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("command", ["stream", "solaris"])
def test_the_cli_refuses_a_negative_encoding_cache_naming_the_flag(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = {
        "stream": ["stream", "--topic", "t", "--group", "g", "--output", str(tmp_path / "o"), "--model", "m"],
        "solaris": [
            "solaris",
            "--topic",
            "t",
            "--candidates-topic",
            "c",
            "--group",
            "g",
            "--output",
            str(tmp_path / "o"),
        ],
    }[command]
    argv += ["--model", "m"] if command == "solaris" else []
    assert main([*argv, "--store", f"lmdb://{tmp_path}/s", "--encoding-cache", "-1"]) == 2
    high = settings.ENCODING_CACHE.high
    assert capsys.readouterr().err.strip().endswith(f"--encoding-cache: got -1. Fix: pass a number in 0..{high}")


def test_the_edges_of_max_history_are_accepted() -> None:
    for value in (1, settings.MAX_HISTORY.high):
        assert FeaturesConfig(["e"], "o", max_history=value).max_history == value


def _literal(node: ast.expr) -> bool:
    """A number written in place (``4096``, ``7 * 86_400.0``); None (no default) is not one."""
    return isinstance(node, ast.BinOp) or (isinstance(node, ast.Constant) and node.value is not None)


def _literal_defaults(tree: ast.AST) -> list[tuple[str, int]]:
    """(name, line) of every config field or keyword parameter in SETTING_FIELDS with a literal default."""
    found: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            if node.target.id in SETTING_FIELDS and _literal(node.value):
                found.append((node.target.id, node.lineno))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            args = node.args
            positional = args.posonlyargs + args.args
            pairs = list(zip(positional[len(positional) - len(args.defaults) :], args.defaults, strict=True))
            pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None]
            for arg, default in pairs:
                if arg.arg in SETTING_FIELDS and _literal(default):
                    found.append((arg.arg, default.lineno))
    return found


def test_no_default_is_written_twice() -> None:
    """A literal default of a setting anywhere in the package (4096 in a second place) fails here."""
    redefined = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for name, line in _literal_defaults(ast.parse(path.read_text()))
    ]
    assert not redefined, "take these defaults from pipelines.settings:\n" + "\n".join(redefined)


def test_the_shared_flag_groups_are_declared_only_in_flags_py() -> None:
    declared = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "flags.py" or (path.name == "config.py" and path.parent.name == "kafka"):
            continue  # flags.py holds the group; io/kafka/config.py the connection flags it wraps
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument" and node.args:
                first = node.args[0]
                if isinstance(first, ast.Constant) and first.value in SHARED_FLAGS:
                    declared.append(f"{path.relative_to(ROOT)}:{node.lineno}: {first.value}")
    assert not declared, "declare these through pipelines.cli.flags:\n" + "\n".join(declared)


def test_the_durations_of_settings_parse() -> None:
    for setting in vars(settings).values():
        if isinstance(setting, settings.Duration):
            assert setting.seconds > 0 and setting.ms == int(setting.seconds * 1000)
