"""Beam's SDK harness at the end of a LOOPBACK job: its one harmless traceback, dropped at the source.

When a job on a Java runner (Flink's or Spark's job server) finishes, the runner closes the data
stream of the SDK harness (which LOOPBACK runs in this process) with gRPC status CANCELLED and
the details ``Multiplexer hanging up`` (Beam's ``BeamFnDataGrpcMultiplexer`` closing). The
harness takes that for a read failure: ``apache_beam.runners.worker.data_plane`` logs "Failed to
read inputs in the data plane" with the traceback, and two harness threads
(``read_grpc_client_inputs``, and the worker loop, which raises it again when it closes the
channel) end with it, printed by :data:`threading.excepthook`. Nothing is lost: the runner hangs
up only once the job is over, and a job that failed fails through its result (``wait_until_finish``),
not through this stream. So this exact exception, and no other, is dropped (:func:`install`):
a traceback on the terminal always means a failure.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

__all__ = ["HANG_UP", "install", "is_hang_up"]

#: The details of the gRPC status a Java runner closes the harness's data stream with.
HANG_UP = "Multiplexer hanging up"
_installed = False


def is_hang_up(exc: BaseException | None) -> bool:
    """Whether ``exc`` is the runner closing the harness's data stream at the end of a job."""
    try:
        import grpc
    except ImportError:  # no Beam portable runner without grpc
        return False
    if not isinstance(exc, grpc.RpcError):
        return False
    code, details = getattr(exc, "code", None), getattr(exc, "details", None)
    if not (callable(code) and callable(details)):
        return False
    return bool(code() == grpc.StatusCode.CANCELLED and details() == HANG_UP)


class _DropHangUp(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and is_hang_up(record.exc_info[1]))


def install() -> None:
    """Drop the hang-up from the harness's data-plane log and from its threads' ends (once per process)."""
    global _installed
    if _installed:
        return
    _installed = True
    logging.getLogger("apache_beam.runners.worker.data_plane").addFilter(_DropHangUp())
    previous = threading.excepthook

    def hook(args: Any) -> None:
        if not is_hang_up(args.exc_value):
            previous(args)

    threading.excepthook = hook
