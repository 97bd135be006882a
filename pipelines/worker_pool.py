"""Beam's SDK worker pool for a cluster whose TaskManagers share one pool (``scripts/flink.sh``).

``python -m pipelines.worker_pool --service_port=50000`` is Beam's
``apache_beam.runners.worker.worker_pool_main`` (each ``StartWorker`` starts a separate SDK worker
process, ``python -c ... SdkHarness(...)``) with one change. Beam's pool keys its workers by the
id in the request, but each TaskManager numbers its workers alike (``1-1``, ``2-1``, ...), so with
two TaskManagers on one pool a ``StopWorker`` from one ended the other's worker with the same id,
and that TaskManager then waited for its worker forever. Here ``StopWorker`` ends no process: a
worker ends by itself when its TaskManager closes its control stream (the stop only reaps the
workers that have ended). Where each TaskManager has its own pool (a Kubernetes sidecar,
``deploy/flink/flinkdeployment.yaml``) Beam's own ``worker_pool_main`` is used as it is.
"""

from __future__ import annotations

import argparse
import logging
import os
import threading
from collections.abc import Sequence
from typing import Any

from apache_beam.portability.api import beam_fn_api_pb2
from apache_beam.runners.worker.worker_pool_main import BeamFnExternalWorkerPoolServicer

log = logging.getLogger(__name__)


class SharedWorkerPool(BeamFnExternalWorkerPoolServicer):
    """Beam's process worker pool whose ``StopWorker`` never ends another TaskManager's worker."""

    def StopWorker(
        self, stop_worker_request: beam_fn_api_pb2.StopWorkerRequest, unused_context: Any
    ) -> beam_fn_api_pb2.StopWorkerResponse:
        self._worker_processes = {k: p for k, p in self._worker_processes.items() if p.poll() is None}
        _reap()
        return beam_fn_api_pb2.StopWorkerResponse()


def _reap() -> None:
    """Collect every ended worker process (one whose entry a later worker with the same id replaced too)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--service_port", type=int, required=True, help="the port the pool listens on")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    address, server = SharedWorkerPool.start(use_process=True, port=args.service_port)
    log.info("SDK worker pool listening at %s", address)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        server.stop(0)


if __name__ == "__main__":
    main()
