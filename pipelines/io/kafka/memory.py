"""Keep the big buffers of bulk reads in the process instead of handing them back to the kernel.

A bounded read allocates several response-sized buffers per Fetch (kafka-python's
receive chunks, join and frame copies, this project's parse and the decoder's
numpy masks), each a few MiB and freed a moment later. glibc serves allocations
that large with ``mmap`` (or trims them off the heap's top) and returns them on
``free``, so every buffer is page-faulted and zeroed afresh, kernel time that
is a noticeable share of a bulk reader's CPU (docs/benchmarks/results.md, kafka). Raising
the mmap threshold and the trim threshold lets freed buffers be reused.

The cost is that a process keeps up to ``TRIM_BYTES`` of freed memory after a
peak, which a bulk reader reuses anyway. It is a process-wide setting, so a library
never applies it behind its host's back: it is an opt-in,
``ReadFromKafka(keep_buffers=True)`` (set by the project's own ``replay`` command),
applied once per worker process and only with glibc; ``GEM_KEEP_BUFFERS=0`` turns it
off even then.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

__all__ = ["MMAP_THRESHOLD_BYTES", "TRIM_BYTES", "keep_large_buffers"]

log = logging.getLogger(__name__)

#: Allocations below this come from the heap, where freed ones are reused (glibc default: 128 KiB, adaptive).
MMAP_THRESHOLD_BYTES = 64 << 20
#: Free memory kept on top of the heap before it is trimmed (glibc default: 128 KiB, adaptive).
TRIM_BYTES = 256 << 20
# mallopt parameter numbers, from glibc's malloc.h
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3

_applied: bool | None = None


def keep_large_buffers() -> bool:
    """Set glibc's thresholds once per process; whether they are in force (False off glibc or when disabled)."""
    global _applied
    if _applied is None:
        _applied = os.environ.get("GEM_KEEP_BUFFERS", "1") != "0" and _mallopt()
        log.debug("large buffers kept for reuse: %s", _applied)
    return _applied


def _mallopt() -> bool:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to tune
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) and mallopt(_M_TRIM_THRESHOLD, TRIM_BYTES))
