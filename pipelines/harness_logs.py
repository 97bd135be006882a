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

Prism ends a job its own way: once the job is done, Beam destroys the Prism process, and the
harness's state-stream reader (the thread ``read_state`` of Beam's ``GrpcStateHandler``) may end
with gRPC status UNAVAILABLE, ``Socket closed``, printed by :data:`threading.excepthook` (seen once
in ~50 runs of a streaming job). That thread's end is dropped too, and only that thread's: a
state stream that breaks mid-job also fails the bundle waiting on it (the handler keeps the
exception and raises it to every request), so the job fails through its result anyway.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

__all__ = ["HANG_UP", "STATE_READER", "install", "is_hang_up", "is_state_stream_closed"]

#: The details of the gRPC status a Java runner closes the harness's data stream with.
HANG_UP = "Multiplexer hanging up"
#: The name of the SDK harness's thread that reads the state stream.
STATE_READER = "read_state"
_installed = False


def is_hang_up(exc: BaseException | None) -> bool:
    """Whether ``exc`` is the runner closing the harness's data stream at the end of a job."""
    status = _status(exc)
    return status is not None and status[0] == "CANCELLED" and status[1] == HANG_UP


def is_state_stream_closed(exc: BaseException | None, thread: str | None) -> bool:
    """Whether ``exc`` ended the harness's state-stream reader (``thread``) as a runner's process went."""
    status = _status(exc)
    return thread == STATE_READER and status is not None and status[0] == "UNAVAILABLE" and "Socket closed" in status[1]


def _status(exc: BaseException | None) -> tuple[str, str] | None:
    """(the gRPC status code's name, the details) of ``exc``; None for anything but a gRPC error."""
    try:
        import grpc
    except ImportError:  # no Beam portable runner without grpc
        return None
    if not isinstance(exc, grpc.RpcError):
        return None
    code, details = getattr(exc, "code", None), getattr(exc, "details", None)
    if not (callable(code) and callable(details)):
        return None
    return str(getattr(code(), "name", "")), str(details() or "")


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
        name = args.thread.name if args.thread is not None else None
        if not (is_hang_up(args.exc_value) or is_state_stream_closed(args.exc_value, name)):
            previous(args)

    threading.excepthook = hook
