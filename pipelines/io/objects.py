"""Folders on object stores (``s3://``, ``gs://``): the few operations Beam's ``FileSystems`` gets wrong there.

On an object store a "folder" is a key prefix with no object of its own, so
``FileSystems.exists("s3://b/out")`` is False even when ``s3://b/out/`` holds a snapshot, and
``FileSystems.delete(["s3://b/out"])`` deletes the one key ``out`` (none), not what is under it.
These helpers treat a path as a folder when objects live under it, on local paths and URIs alike.

Deletes on ``s3://`` go one object at a time (``DeleteObject``): Beam's ``FileSystems.delete`` sends
``DeleteObjects`` batches, which boto3 >= 1.36 signs with a CRC-32 checksum header that
S3-compatible servers such as S3Proxy 2.6.0 refuse (``NotImplemented``).
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pyarrow.fs as pafs
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines.optional import require

__all__ = [
    "arrow_filesystem",
    "copy_file",
    "delete_object",
    "delete_tree",
    "ensure_options",
    "exists",
    "is_local",
    "list_tree",
    "local_path",
    "local_stand_in",
    "share_s3_clients",
    "upload_tree",
]

log = logging.getLogger(__name__)

_CHUNK = 8 << 20


def is_local(path: str) -> bool:
    """Whether ``path`` is on a local filesystem (no URI scheme, or ``file://``)."""
    return "://" not in path or path.startswith("file://")


def local_path(path: str) -> str:
    """A local path without its ``file://`` scheme."""
    return path.removeprefix("file://")


def list_tree(folder: str) -> dict[str, tuple[int, float]]:
    """``{path: (bytes, updated)}`` of every object under the prefix ``folder/`` (empty when none);
    ``updated`` is the store's modification time in seconds (the server's clock)."""
    ensure_options(folder)
    prefix = folder.rstrip("/") + "/"
    found = {}
    for result in FileSystems.match([prefix + "**"]):
        for meta in result.metadata_list:
            found[meta.path] = (int(meta.size_in_bytes), float(meta.last_updated_in_seconds or 0.0))
    return found


def exists(path: str) -> bool:
    """Whether ``path`` is a file, or a folder (on an object store: a prefix with objects under it)."""
    if is_local(path):
        return Path(local_path(path)).exists()
    ensure_options(path)
    return FileSystems.exists(path) or bool(list_tree(path))


def delete_object(path: str) -> None:
    """Delete one file or object; one that is already gone is not an error."""
    if is_local(path):
        Path(local_path(path)).unlink(missing_ok=True)
        return
    ensure_options()
    if path.startswith("s3://"):
        from apache_beam.io.aws import s3io

        fs = FileSystems.get_filesystem(path)
        s3io.S3IO(options=getattr(fs, "_options", None) or _default_options()).delete(path)  # 404 is not raised
        return
    if FileSystems.exists(path):
        FileSystems.delete([path])


def delete_tree(folder: str) -> None:
    """Delete ``folder`` and everything under it (a missing one is not an error)."""
    if is_local(folder):
        shutil.rmtree(local_path(folder), ignore_errors=True)
        return
    for path in sorted(list_tree(folder)):
        delete_object(path)


def copy_file(source: str, target: str) -> None:
    """Copy one file between any two filesystems Beam knows (local paths included), streamed."""
    ensure_options()
    if is_local(target):
        Path(local_path(target)).parent.mkdir(parents=True, exist_ok=True)
    with FileSystems.open(source, compression_type="uncompressed") as src:
        with FileSystems.create(target, compression_type="uncompressed") as dst:
            shutil.copyfileobj(src, dst, _CHUNK)


def upload_tree(local: str | Path, folder: str) -> list[str]:
    """Copy every file under the local folder ``local`` to ``folder`` (same relative paths); returns them."""
    base = Path(local)
    names = sorted(str(p.relative_to(base)) for p in base.rglob("*") if p.is_file())
    for name in names:
        copy_file(str(base / name), f"{folder.rstrip('/')}/{name}")
    return names


@contextmanager
def local_stand_in(folder: str, prefix: str = "gem-") -> Iterator[str]:
    """``folder`` itself when local; for an object store, a temporary local folder whose files are
    uploaded to ``folder`` when the block ends without an error (for writers that need local files,
    such as FAISS). The temporary folder is always removed."""
    if is_local(folder):
        yield folder
        return
    with tempfile.TemporaryDirectory(prefix=prefix) as local:
        yield local
        upload_tree(local, folder)


def arrow_filesystem(path: str) -> tuple[pafs.FileSystem | None, str]:
    """pyarrow's filesystem for ``path`` and the path to give it: for ``s3://``, a
    ``pyarrow.fs.S3FileSystem`` at the endpoint Beam's S3 filesystem uses (``--s3_endpoint_url``,
    else ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``), so both read the same store; credentials
    come from the environment (pyarrow's default chain). Other paths: ``(None, path)``."""
    if not path.startswith("s3://"):
        return None, path
    ensure_options(path)
    from apache_beam.options.pipeline_options import S3Options

    s3 = (FileSystems._pipeline_options or _default_options()).view_as(S3Options)
    env = os.environ.get
    endpoint = s3.s3_endpoint_url or env("AWS_ENDPOINT_URL_S3") or env("AWS_ENDPOINT_URL") or ""
    region = s3.s3_region_name or env("AWS_REGION") or env("AWS_DEFAULT_REGION") or ""
    return _arrow_s3(endpoint, region), path.removeprefix("s3://")


@functools.cache
def _arrow_s3(endpoint: str, region: str) -> pafs.S3FileSystem:
    options: dict[str, str] = {"region": region} if region else {}
    if endpoint:
        url = urlsplit(endpoint)
        options |= {"endpoint_override": url.netloc, "scheme": url.scheme or "https"}
    return pafs.S3FileSystem(**options)


def ensure_options(path: str = "") -> None:
    """Give Beam's filesystems default options when no pipeline has set any (a driver that reads
    ``s3://`` before it builds a pipeline): the S3 client then takes its endpoint and credentials
    from the standard AWS environment variables. Also shares S3 clients (:func:`share_s3_clients`).
    For an ``s3://`` ``path``, :class:`~pipelines.optional.MissingExtraError` without the ``s3`` extra."""
    from apache_beam.options.value_provider import RuntimeValueProvider

    if path.startswith("s3://"):
        require("boto3", "s3", f"{path}: Beam's S3 filesystem")

    share_s3_clients()
    if FileSystems._pipeline_options is None and RuntimeValueProvider.runtime_options is None:
        FileSystems.set_options(_default_options())


_S3_CLIENTS: dict[tuple, object] = {}
_S3_CLIENTS_LOCK = threading.Lock()


def share_s3_clients() -> None:
    """Make Beam's S3 filesystem reuse one boto3 client per configuration in this process.

    Beam builds a new boto3 session and client for every filesystem call (each ``exists``,
    ``open``, ``match``), and building one parses botocore's service description, which costs
    far more than a small request to the store itself. boto3 clients are
    thread-safe, so the client (never Beam's wrapper, which holds one download's state) is
    cached by the S3 options and the ``AWS_*`` environment it was built from. Idempotent."""
    try:
        from apache_beam.io.aws.clients.s3 import boto3_client
    except ImportError:  # no s3 extra: Beam's S3 filesystem is absent too
        return
    wrapper = boto3_client.Client
    if getattr(wrapper, "_gem_shared", False):
        return
    build = wrapper.__init__

    def init(self: Any, options: Any) -> None:
        key = _client_key(options)
        with _S3_CLIENTS_LOCK:
            client = _S3_CLIENTS.get(key)
        if client is None:
            build(self, options)
            with _S3_CLIENTS_LOCK:
                _S3_CLIENTS.setdefault(key, self.client)
            return
        self.client = client
        self._download_request = None
        self._download_stream = None
        self._download_pos = 0

    setattr(wrapper, "__init__", init)  # noqa: B010 (mypy refuses assigning to a method)
    setattr(wrapper, "_gem_shared", True)  # noqa: B010


def _client_key(options: Any) -> tuple:
    from apache_beam.options.pipeline_options import S3Options

    s3 = options.view_as(S3Options).get_all_options() if isinstance(options, PipelineOptions) else dict(options)
    settings = tuple(sorted((k, str(v)) for k, v in s3.items() if k.startswith("s3_")))
    return settings, tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_")))


def _default_options() -> PipelineOptions:
    return PipelineOptions([])
