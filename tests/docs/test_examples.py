"""The documentation's command examples are run, so an example that stops working fails the tests.

An example is a fenced ```bash block preceded by the line ``<!-- run -->`` in a page under docs/.
The examples run with ``bash -euo pipefail`` in one working folder per chain, page after page in
:data:`CHAINS`' order, so a guide can use what an earlier guide wrote (``out/features``, ``out/model``):
the quickstart runs alone in an empty folder; the guides and operations pages run as one chain.
The examples are written with small sizes; the only rewrite is that every Kafka topic and consumer
group gets a suffix unique to the run, and the topics are created beforehand without time
retention (the generated events are stamped in the past) and deleted afterwards.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pipelines.io.kafka.config import KafkaConnection
from tests.docs.reference_hook import ROOT

pytestmark = pytest.mark.integration

DOCS = ROOT / "docs"
MARKER = "<!-- run -->"
#: chains of pages, each run in order in a folder of its own
CHAINS: dict[str, list[str]] = {
    "quickstart": ["getting-started/quickstart.md"],
    "guides": [
        "guides/generate.md",
        "guides/features.md",
        "guides/inspect.md",
        "guides/train.md",
        "guides/precompute.md",
        "guides/similarity.md",
        "operations/online-stores.md",
        "guides/kafka.md",
        "guides/streaming.md",
        "guides/solaris.md",
        "guides/transfer.md",
        "operations/runners.md",
        "operations/dataflow.md",
    ],
}
_KAFKA_NAME = re.compile(r"(--(?:to-topic|dead-letter-topic|candidates-topic|topic|group))(\s+)([\w.-]+)")
_BLOCK = re.compile(r"^" + re.escape(MARKER) + r"\n```bash[^\n]*\n(.*?)\n```", re.S | re.M)


@dataclass(frozen=True)
class Example:
    page: str
    script: str


def _marks(text: str) -> int:
    return sum(1 for line in text.splitlines() if line == MARKER)


def examples(page: str) -> list[Example]:
    """The marked examples of ``page`` (a path under docs/), in order."""
    text = (DOCS / page).read_text()
    found = [Example(page, m.group(1)) for m in _BLOCK.finditer(text)]
    assert len(found) == _marks(text), f"{page}: every {MARKER} line must be followed by a ```bash block"
    return found


def with_unique_kafka_names(script: str, suffix: str) -> str:
    return _KAFKA_NAME.sub(lambda m: f"{m.group(1)}{m.group(2)}{m.group(3)}-{suffix}", script)


def topics_of(script: str) -> dict[str, int]:
    """Topic name -> partitions (``--num-partitions`` of the same command, else produce's default 4)."""
    topics: dict[str, int] = {}
    for command in script.replace("\\\n", " ").splitlines():
        partitions = re.search(r"--num-partitions\s+(\d+)", command)
        for flag, _, name in _KAFKA_NAME.findall(command):
            if flag != "--group":
                topics.setdefault(name, int(partitions.group(1)) if partitions else 4)
    return topics


def test_every_marked_example_is_in_a_chain() -> None:
    chained = {page for pages in CHAINS.values() for page in pages}
    marked = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md") if _marks(p.read_text())}
    assert marked <= chained, f"pages with {MARKER} examples that no chain runs: {sorted(marked - chained)}"
    for page in sorted(marked):
        assert examples(page)


def test_kafka_names_get_the_suffix() -> None:
    script = "python -m pipelines replay --topic events --to-topic histories --group g1 --output out/r"
    assert with_unique_kafka_names(script, "x") == (
        "python -m pipelines replay --topic events-x --to-topic histories-x --group g1-x --output out/r"
    )
    assert topics_of("produce --topic a --num-partitions 2\nreplay --topic a --to-topic b") == {"a": 2, "b": 4}
    assert with_unique_kafka_names("solaris --topic e --candidates-topic c", "x") == (
        "solaris --topic e-x --candidates-topic c-x"
    )


@pytest.fixture(scope="module")
def suffix(kafka: KafkaConnection) -> Iterator[str]:
    from pipelines.io.kafka.produce import delete_topics, ensure_topic

    suffix = f"docs-{uuid.uuid4().hex[:8]}"
    created: list[str] = []
    for page in CHAINS["guides"]:
        for example in examples(page):
            for name, partitions in topics_of(with_unique_kafka_names(example.script, suffix)).items():
                if name not in created and ensure_topic(kafka, name, partitions, configs={"retention.ms": "-1"}):
                    created.append(name)
    yield suffix
    if created:
        delete_topics(kafka, created)


def _run(example: Example, cwd: Path, suffix: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    script = with_unique_kafka_names(example.script, suffix)
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, (
        f"the example of docs/{example.page} failed (exit {done.returncode}):\n{script}\n"
        f"--- stdout (tail)\n{done.stdout[-3000:]}\n--- stderr (tail)\n{done.stderr[-3000:]}"
    )


@pytest.mark.parametrize("chain", sorted(CHAINS))
def test_the_examples_run(chain: str, suffix: str, tmp_path: Path) -> None:
    for page in CHAINS[chain]:
        for example in examples(page):
            _run(example, tmp_path, suffix)
