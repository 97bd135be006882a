"""keep_large_buffers: freed response-sized buffers are reused instead of page-faulted afresh."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# In a fresh interpreter: apply the setting (or not), then allocate, fill and free a 40 MiB
# buffer (above glibc's adaptive mmap ceiling of 32 MiB) 20 times; print the setting's
# answer and the page faults the loop took.
_PROBE = """
import resource, sys
from pipelines.io.kafka.memory import keep_large_buffers
applied = keep_large_buffers()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    buffer = b"x" * (40 << 20)
    del buffer
print(applied, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""
_PAGES = (40 << 20) // os.sysconf("SC_PAGE_SIZE")


def _probe(keep: str) -> tuple[bool, int]:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE],
        env={**os.environ, "GEM_KEEP_BUFFERS": keep},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return out[0] == "True", int(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_freed_buffers_are_reused_instead_of_faulted_again() -> None:
    applied, faults = _probe("1")
    assert applied
    assert faults < 3 * _PAGES  # the first buffer's pages, then reuse


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_turned_off_leaves_the_allocator_alone() -> None:
    applied, faults = _probe("0")
    assert not applied
    assert faults > 10 * _PAGES  # each buffer mapped and faulted afresh: what the setting saves


def test_building_a_fetcher_leaves_the_host_process_allocator_alone() -> None:
    """An embedding pipeline gets no process-wide change: only ReadFromKafka(keep_buffers=True) opts in."""
    probe = (
        "from pipelines.io.kafka import memory\n"
        "from pipelines.io.kafka.config import KafkaConnection\n"
        "from pipelines.io.kafka.consume import KafkaPythonFetcher\n"
        "fetcher = KafkaPythonFetcher(KafkaConnection(bootstrap_servers=('127.0.0.1:9',)))\n"
        "print(memory._applied)\n"
        "fetcher.close()\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.split()[-1] == "None"
