"""mkdocs hook: the reference pages, generated from the code at every build so they cannot drift.

- ``reference/cli.md``: every command and flag, from the argparse parsers of ``pipelines.cli``;
- ``reference/dead-letters.md``: every dead-letter reason code, from the modules that emit them;
- ``reference/layouts.md``: every record layout and enum, from ``pipelines.schemas``;
- ``reference/store-uris.md``: the ``--store`` URI forms, from ``pipelines.store.registry``.

The pages exist only in the built site (``on_files`` adds them); ``render_pages()`` returns their
text for tests.
"""

from __future__ import annotations

import argparse
import importlib
import re
from typing import Any

from mkdocs.structure.files import File, Files

PAGES = {
    "reference/cli.md": "_cli",
    "reference/dead-letters.md": "_dead_letters",
    "reference/layouts.md": "_layouts",
    "reference/store-uris.md": "_store_uris",
}


def on_files(files: Files, config: Any) -> Files:
    for path, text in render_pages().items():
        files.append(File.generated(config, path, content=text))
    return files


def render_pages() -> dict[str, str]:
    """Generated page path -> its Markdown."""
    return {path: globals()[name]() for path, name in PAGES.items()}


def _rst(text: str) -> str:
    """Docstring markup to Markdown: ``code`` -> `code`, :role:`X` -> `X`."""
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")


def _page(lines: list[str]) -> str:
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


# ---------------------------------------------------------------- CLI


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[name]
    raise LookupError(f"no sub-command {name!r} in the CLI parser")


def _flag_row(action: argparse.Action, formatter: argparse.HelpFormatter) -> str:
    flags = ", ".join(f"`{s}`" for s in action.option_strings) or f"`{action.dest}`"
    if action.nargs != 0:
        if action.choices is not None:
            flags += " `{" + ",".join(str(c) for c in action.choices) + "}`"
        else:
            metavar = action.metavar or (action.dest.upper() if action.option_strings else action.dest)
            flags += f" `{metavar}`"
    text = formatter._expand_help(action) if action.help else ""
    if action.required:
        text = f"**required.** {text}"
    return f"| {flags} | {_cell(text)} |"


def _cli() -> str:
    cli = importlib.import_module("pipelines.cli")
    lines = [
        "# Command line",
        "",
        "Generated from the argparse parsers of `pipelines.cli` at every build of this site.",
        "Every command is `python -m pipelines COMMAND` (or `gem-pipelines COMMAND`); `-v` logs at",
        "DEBUG level. A bad flag stops the command with `error: ... Fix: ...` and exit status 2.",
        "",
        "| command | what it does |",
        "|---|---|",
    ]
    lines += [f"| [`{name}`](#{name}) | {_cell(help_text)} |" for name, (_, help_text) in cli.COMMANDS.items()]
    for name, (module_path, help_text) in cli.COMMANDS.items():
        parser = _subparser(cli.build_parser([name]), name)
        module = importlib.import_module(module_path)
        formatter = parser._get_formatter()
        lines += ["", f"## {name}", "", f"{help_text}.", ""]
        if parser.description:
            lines += [_rst(parser.description).strip(), ""]
        lines += ["| flag | meaning |", "|---|---|"]
        lines += [
            _flag_row(action, formatter)
            for action in parser._actions
            if not isinstance(action, argparse._HelpAction) and action.help != argparse.SUPPRESS
        ]
        if getattr(module, "ACCEPTS_BEAM_ARGS", False):
            lines += ["", "Any other `--flag value` is passed to Beam as a pipeline option, exactly as given."]
    return _page(lines)


# ---------------------------------------------------------------- dead letters


def _reason_table(reasons: dict[str, str]) -> list[str]:
    return ["| reason | when |", "|---|---|", *(f"| `{code}` | {_cell(when)} |" for code, when in reasons.items())]


def _dead_letters() -> str:
    features = importlib.import_module("pipelines.features.reasons")
    precompute = importlib.import_module("pipelines.precompute.requests")
    candidate_sets = importlib.import_module("pipelines.io.kafka.candidate_sets")
    return _page(
        [
            "# Dead-letter reason codes",
            "",
            "Generated from the code that emits them at every build of this site. A dead letter is a",
            "row of the DEAD_LETTER layout (`stage`, `reason`, `detail`, `payload`, `source`); see",
            "[failures and recovery](../operations/failures.md).",
            "",
            "## Events: `features`, `replay`, `stream`",
            "",
            "One decoder for files and Kafka (`pipelines/features/reasons.py`); Parquet is checked by the",
            "same rules, column-wise.",
            "",
            *_reason_table(features.WHEN),
            "",
            "## Candidate rows: `precompute`",
            "",
            "From `pipelines/precompute/requests.py`.",
            "",
            *_reason_table(precompute.REASONS),
            "",
            "## Candidate-set messages: `solaris`",
            "",
            "From `pipelines/io/kafka/candidate_sets.py`: counted per reason in",
            "`gem_dead_letters_total{reason}` and, with `--dead-letters DIR`, written to `DIR/dead_letters/`.",
            "",
            *_reason_table(candidate_sets.REASONS),
        ]
    )


# ---------------------------------------------------------------- layouts


def _layouts() -> str:
    layouts = importlib.import_module("pipelines.schemas.layouts")
    enums = importlib.import_module("pipelines.schemas.enums")
    lines = [
        "# Record layouts",
        "",
        "Generated from `pipelines/schemas/layouts.py` at every build of this site. Every Parquet file",
        f"carries its layout's name and version in its metadata (`{layouts.NAME_KEY.decode()}`,",
        f"`{layouts.VERSION_KEY.decode()}`). The event wire format for producers in any language is",
        "`pipelines/schemas/event.schema.json`.",
    ]
    for name, layout in layouts.LAYOUTS.items():
        lines += ["", f"## {name}", "", f"Version {layout.version}.", ""]
        lines += ["| field | type | nullable |", "|---|---|---|"]
        lines += [f"| `{f.name}` | `{_cell(str(f.type))}` | {'yes' if f.nullable else 'no'} |" for f in layout.schema]
        if layout.sized_by:
            lines += ["", f"`{layout.sized_by}` is a fixed-size list whose size a file may choose."]
    lines += ["", "## Enums", "", "Lower-case strings on the wire, small integer codes (their position) in Arrow."]
    for name in ("SURFACES", "EVENT_TYPES", "DEVICES", "FUNNEL_STAGES"):
        values = getattr(enums, name, None)
        if values is not None:
            lines += ["", f"`{name}`: " + ", ".join(f"{i} `{v}`" for i, v in enumerate(values))]
    return _page(lines)


# ---------------------------------------------------------------- store URIs


def _store_uris() -> str:
    registry = importlib.import_module("pipelines.store.registry")
    backends = ", ".join(f"`{name}`" for name in registry.BACKENDS)
    return _page(
        [
            "# Store URIs",
            "",
            "Generated from `pipelines/store/registry.py` at every build of this site. Every command that",
            "takes `--store` parses it with `parse_store_uri` before any work; a bad URI stops the command",
            "naming `--store` and the fix. See [online stores](../operations/online-stores.md).",
            "",
            f"Backends: {backends}.",
            "",
            _rst(registry.__doc__ or "").strip(),
        ]
    )
