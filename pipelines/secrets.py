"""Where passwords come from, so that none travels inside a pipeline.

A worker (a Beam SDK harness on this host, a Flink TaskManager's pool, a Dataflow VM) reads a
secret from its environment: ``GEM_KAFKA_SASL_PASSWORD`` and ``GEM_REDIS_PASSWORD``, or a file
named by ``GEM_KAFKA_SASL_PASSWORD_FILE`` / ``GEM_REDIS_PASSWORD_FILE`` (a mounted Kubernetes or
Secret Manager secret). The DoFns and pipeline options carry no password: a Kafka connection
pickles without it and a store URI reaches the pipeline without its user info's password.

On the driver, a password given on the command line (``--sasl-password``, a
``redis://:PASSWORD@host`` URI) is moved into this process's environment, so that workers on this
host (which inherit it) find it, and it is registered with :mod:`pipelines.redact`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

from pipelines.errors import ConfigError
from pipelines.redact import register_secret

__all__ = ["REDIS_PASSWORD", "SASL_PASSWORD", "Secret", "move_store_password", "scoped", "split_password"]


@dataclass(frozen=True)
class Secret:
    """A password read from the environment variable ``env`` or the file named by ``env + "_FILE"``."""

    env: str

    @property
    def file_env(self) -> str:
        return f"{self.env}_FILE"

    def read(self) -> str | None:
        """The secret, or None when neither variable is set (registered for redaction either way)."""
        value = os.environ.get(self.env)
        if value is None and (path := os.environ.get(self.file_env)):
            try:
                value = Path(path).read_text().rstrip("\r\n")
            except OSError as exc:
                raise ConfigError(
                    self.file_env, f"cannot read {path} ({exc.strerror})", "point it at a readable secret file"
                ) from exc
        register_secret(value)
        return value

    def export(self, value: str) -> None:
        """Make ``value`` this process's (and its children's) secret."""
        register_secret(value)
        os.environ[self.env] = value


SASL_PASSWORD = Secret("GEM_KAFKA_SASL_PASSWORD")
REDIS_PASSWORD = Secret("GEM_REDIS_PASSWORD")


def split_password(uri: str) -> tuple[str, str | None]:
    """``uri`` without the password of its user info, and that password (percent-decoded), if any."""
    try:
        parts = urlsplit(uri)
        password = parts.password
    except ValueError:
        return uri, None
    if password is None:
        return uri, None
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    netloc = f"{user}@{host}" if user else host
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment)), unquote(password)


@contextmanager
def scoped() -> Iterator[None]:
    """Restore the secrets' environment variables on exit (a command run in-process, as tests do,
    leaves the next one the environment it found)."""
    names = [name for secret in (SASL_PASSWORD, REDIS_PASSWORD) for name in (secret.env, secret.file_env)]
    before = {name: os.environ.get(name) for name in names}
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def move_store_password(uri: str | None) -> str | None:
    """A Redis ``--store`` URI without its password, which moves into ``GEM_REDIS_PASSWORD``."""
    if not uri or not uri.lower().startswith(("redis://", "rediss://", "redis-cluster://")):
        return uri
    bare, password = split_password(uri)
    if password is not None:
        REDIS_PASSWORD.export(password)
    return bare
