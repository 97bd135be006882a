"""How to reach a Kafka cluster: bootstrap servers, security protocol, SASL and TLS settings.

:class:`KafkaConnection` is the one typed place for these settings; every client
the project builds (kafka-python consumer, producer and admin, the optional
confluent-kafka backend, ``kcat`` in the bench) takes its settings from it.
:func:`add_connection_arguments` adds the matching ``--bootstrap-servers``,
``--security-protocol``, ``--sasl-*`` and ``--ssl-*`` flags to a command;
passwords are better given through ``GEM_KAFKA_SASL_PASSWORD`` than on a command line.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from pipelines.errors import ConfigError
from pipelines.redact import register_secret
from pipelines.secrets import SASL_PASSWORD

__all__ = [
    "DEFAULT_BOOTSTRAP",
    "SASL_MECHANISMS",
    "SECURITY_PROTOCOLS",
    "KafkaConnection",
    "add_connection_arguments",
    "connection_from_args",
]

#: The project's own broker (``make kafka-up``); ``GEM_KAFKA_BOOTSTRAP`` overrides it.
DEFAULT_BOOTSTRAP = "127.0.0.1:19092"
SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


@dataclass(frozen=True)
class KafkaConnection:
    """Connection settings, validated on construction (errors name the flag and the fix)."""

    bootstrap_servers: tuple[str, ...] = (DEFAULT_BOOTSTRAP,)
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = field(default=None, repr=False)
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    client_id: str = "gem-pipelines"

    def __post_init__(self) -> None:
        register_secret(self.sasl_password)
        if self.sasl_password is not None and SASL_PASSWORD.read() is None:
            SASL_PASSWORD.export(self.sasl_password)  # workers on this host read it there: none is pickled
        if not self.bootstrap_servers or not all(_is_host_port(s) for s in self.bootstrap_servers):
            raise ConfigError(
                "--bootstrap-servers",
                f"got {','.join(self.bootstrap_servers)!r}",
                "pass host:port[,host:port...], e.g. 127.0.0.1:19092",
            )
        if self.security_protocol not in SECURITY_PROTOCOLS:
            raise ConfigError(
                "--security-protocol", f"got {self.security_protocol!r}", f"pass one of {', '.join(SECURITY_PROTOCOLS)}"
            )
        self._check_sasl()
        self._check_tls()

    def _check_sasl(self) -> None:
        uses_sasl = self.security_protocol.startswith("SASL_")
        if not uses_sasl:
            if self.sasl_mechanism or self.sasl_username:
                raise ConfigError(
                    "--sasl-mechanism",
                    f"is set but --security-protocol is {self.security_protocol}",
                    "use --security-protocol SASL_PLAINTEXT or SASL_SSL, or drop the --sasl-* flags",
                )
            return
        if self.sasl_mechanism not in SASL_MECHANISMS:
            raise ConfigError(
                "--sasl-mechanism", f"got {self.sasl_mechanism!r}", f"pass one of {', '.join(SASL_MECHANISMS)}"
            )
        if not self.sasl_username or self.sasl_password is None:
            raise ConfigError(
                "--sasl-username",
                "SASL needs a user name and a password",
                "pass --sasl-username and set GEM_KAFKA_SASL_PASSWORD (or --sasl-password)",
            )

    def _check_tls(self) -> None:
        uses_tls = self.security_protocol in ("SSL", "SASL_SSL")
        files = {
            "--ssl-cafile": self.ssl_cafile,
            "--ssl-certfile": self.ssl_certfile,
            "--ssl-keyfile": self.ssl_keyfile,
        }
        for flag, path in files.items():
            if path is None:
                continue
            if not uses_tls:
                raise ConfigError(
                    flag,
                    f"is set but --security-protocol is {self.security_protocol}",
                    "use --security-protocol SSL or SASL_SSL, or drop the --ssl-* flags",
                )
            if not Path(path).is_file():
                raise ConfigError(flag, f"{path!r} is not a readable file", "give the path of a PEM file")
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ConfigError(
                "--ssl-keyfile",
                "a client certificate needs both a cert and a key",
                "pass both --ssl-certfile and --ssl-keyfile, or neither",
            )

    def __reduce__(self) -> tuple[Any, tuple[dict[str, Any]]]:
        """Pickled (into a DoFn, a job graph) without the password: a worker reads it from its own
        environment or secret file (:data:`pipelines.secrets.SASL_PASSWORD`)."""
        state = {f.name: getattr(self, f.name) for f in fields(self)}
        state["sasl_password"] = None
        return _restore, (state,)

    @property
    def password(self) -> str | None:
        """The SASL password: this object's, else the environment's (on a worker)."""
        if self.sasl_password is not None or not self.sasl_mechanism:
            return self.sasl_password
        password = SASL_PASSWORD.read()
        if password is None:
            raise ConfigError(
                SASL_PASSWORD.env,
                "this worker has no SASL password",
                f"set {SASL_PASSWORD.env} (or {SASL_PASSWORD.file_env}, a secret file) in the workers' environment",
            )
        return password

    @property
    def bootstrap(self) -> str:
        return ",".join(self.bootstrap_servers)

    def kafka_python(self) -> dict[str, Any]:
        """Keyword arguments for kafka-python's KafkaConsumer, KafkaProducer and KafkaAdminClient."""
        kwargs: dict[str, Any] = {
            "bootstrap_servers": list(self.bootstrap_servers),
            "security_protocol": self.security_protocol,
            "client_id": self.client_id,
        }
        if self.sasl_mechanism:
            kwargs.update(
                sasl_mechanism=self.sasl_mechanism,
                sasl_plain_username=self.sasl_username,
                sasl_plain_password=self.password,
            )
        if self.security_protocol in ("SSL", "SASL_SSL"):
            kwargs.update(
                ssl_cafile=self.ssl_cafile,
                ssl_certfile=self.ssl_certfile,
                ssl_keyfile=self.ssl_keyfile,
                ssl_check_hostname=True,
            )
        return kwargs

    def librdkafka(self) -> dict[str, str]:
        """Properties for librdkafka clients (confluent-kafka, ``kcat -X key=value``)."""
        conf = {
            "bootstrap.servers": self.bootstrap,
            "security.protocol": self.security_protocol.lower(),
            "client.id": self.client_id,
        }
        if self.sasl_mechanism:
            conf.update(
                {
                    "sasl.mechanism": self.sasl_mechanism,
                    "sasl.username": self.sasl_username or "",
                    "sasl.password": self.password or "",
                }
            )
        optional = {
            "ssl.ca.location": self.ssl_cafile,
            "ssl.certificate.location": self.ssl_certfile,
            "ssl.key.location": self.ssl_keyfile,
        }
        conf.update({k: v for k, v in optional.items() if v})
        return conf


def _restore(state: dict[str, Any]) -> KafkaConnection:
    """A connection as pickled: already validated where it was built, so no check runs again."""
    connection = object.__new__(KafkaConnection)
    for name, value in state.items():
        object.__setattr__(connection, name, value)
    return connection


def _is_host_port(server: str) -> bool:
    host, _, port = server.strip().rpartition(":")
    return bool(host) and port.isdigit() and 0 < int(port) < 65536


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    """The connection flags (defaults from ``GEM_KAFKA_*`` environment variables)."""
    env = os.environ.get
    group = parser.add_argument_group("Kafka connection (defaults: GEM_KAFKA_* environment variables)")
    group.add_argument(
        "--bootstrap-servers",
        default=env("GEM_KAFKA_BOOTSTRAP", DEFAULT_BOOTSTRAP),
        metavar="HOST:PORT[,...]",
        help="brokers to bootstrap from (default: %(default)s)",
    )
    group.add_argument(
        "--security-protocol",
        default=env("GEM_KAFKA_SECURITY_PROTOCOL", "PLAINTEXT"),
        choices=SECURITY_PROTOCOLS,
        help="(default: %(default)s)",
    )
    group.add_argument("--sasl-mechanism", default=env("GEM_KAFKA_SASL_MECHANISM"), choices=SASL_MECHANISMS)
    group.add_argument("--sasl-username", default=env("GEM_KAFKA_SASL_USERNAME"))
    group.add_argument(
        "--sasl-password",
        default=None,
        help="prefer the GEM_KAFKA_SASL_PASSWORD environment variable or a secret file named by "
        "GEM_KAFKA_SASL_PASSWORD_FILE (not shown in ps; workers read them too)",
    )
    group.add_argument(
        "--ssl-cafile",
        default=env("GEM_KAFKA_SSL_CAFILE"),
        metavar="PEM",
        help="CA bundle that signed the brokers' certificates",
    )
    group.add_argument(
        "--ssl-certfile", default=env("GEM_KAFKA_SSL_CERTFILE"), metavar="PEM", help="client certificate (mutual TLS)"
    )
    group.add_argument(
        "--ssl-keyfile", default=env("GEM_KAFKA_SSL_KEYFILE"), metavar="PEM", help="client private key (mutual TLS)"
    )


def connection_from_args(args: argparse.Namespace) -> KafkaConnection:
    """A validated :class:`KafkaConnection` from the flags of :func:`add_connection_arguments`."""
    if args.sasl_password is not None:  # workers on this host inherit it; none is pickled
        SASL_PASSWORD.export(args.sasl_password)
    password = SASL_PASSWORD.read()
    return KafkaConnection(
        bootstrap_servers=tuple(s.strip() for s in args.bootstrap_servers.split(",") if s.strip()),
        security_protocol=args.security_protocol,
        sasl_mechanism=args.sasl_mechanism,
        sasl_username=args.sasl_username,
        sasl_password=password,
        ssl_cafile=args.ssl_cafile,
        ssl_certfile=args.ssl_certfile,
        ssl_keyfile=args.ssl_keyfile,
    )
