"""The one redaction rule for everything the project prints, logs or writes.

:func:`redact` masks, in any text:

- the password of a URI's user info (``redis://:pw@host`` → ``redis://:***@host``,
  ``scheme://user:pw@host`` → ``scheme://user:***@host``);
- the value of a secret-looking query option (``password=``, ``secret=``, ``token=``, ...);
- every value registered with :func:`register_secret` (the Kafka SASL password, a
  store URI's password), wherever it appears: in a client library's error, a traceback,
  a pipeline option.

The CLI routes stdout, stderr and every log record through it
(:func:`install`), and the summary writer applies it to ``summary.json``.
"""

from __future__ import annotations

import io
import logging
import re
import sys
from collections.abc import Mapping
from typing import Any, TextIO
from urllib.parse import unquote, urlsplit

__all__ = ["MASK", "install", "redact", "redact_fields", "register_secret", "register_uri"]

MASK = "***"
_USERINFO = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^:@/\s'\"]*):(?P<secret>[^@/\s'\"]+)@")
_QUERY = re.compile(
    r"(?i)(?P<head>[?&;](?:password|passwd|pwd|pass|secret|token|api_key|apikey|access_key|sasl_password)=)"
    r"(?P<secret>[^&;\s'\"]+)"
)
#: A secret-named command-line flag and its value, as typed (``--sasl_password X``, ``--api-token=X``) or
#: as Python prints an argument list (``'--sasl_password', 'X'``: Beam's "Discarding unparseable args").
_FLAG = re.compile(
    r"(?i)(?P<head>--[\w-]*(?:pass(?:word)?|passwd|secret|token|credential|private[_-]?key|api[_-]?key)[\w-]*"
    r"(?:=|'?,?\s+'?))(?P<secret>[^\s'\",\]]+)"
)
#: Option and field names whose text values are secrets as a whole (``sasl_password``, ``api_token``,
#: ``s3_secret_access_key``); a number under such a name (``token_budget``) is a count, not a secret.
_SECRET_NAME = re.compile(r"pass(word)?|passwd|secret|token|credential|private_key|api_?key", re.IGNORECASE)
#: Registered secret values (at least 3 characters: shorter ones would mask ordinary text).
_SECRETS: set[str] = set()


def register_secret(value: str | None) -> None:
    """Mask ``value`` wherever it appears from now on (in this process)."""
    if value and len(value) >= 3:
        _SECRETS.add(value)


def register_uri(uri: str | None) -> None:
    """Register the password (raw and percent-decoded) that ``uri``'s user info holds, if any."""
    if not uri:
        return
    try:
        password = urlsplit(uri).password
    except ValueError:
        password = None
    if password:
        register_secret(password)
        register_secret(unquote(password))
    for match in _QUERY.finditer(uri):
        register_secret(match["secret"])


def redact(text: str) -> str:
    """``text`` with URI passwords, secret query options and registered secrets masked."""
    if not isinstance(text, str):
        text = str(text)
    text = _USERINFO.sub(lambda m: f"{m['head']}:{MASK}@", text)
    text = _QUERY.sub(lambda m: f"{m['head']}{MASK}", text)
    text = _FLAG.sub(_mask_flag, text)
    for secret in sorted(_SECRETS, key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, MASK)
    return text


def _mask_flag(match: re.Match[str]) -> str:
    """The flag with its value masked; a next flag (no value) or a token *budget* (a count) is kept."""
    if match["secret"].startswith("-") or "budget" in match["head"].lower():
        return match[0]
    return f"{match['head']}{MASK}"


def redact_fields(values: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``values`` with every string (also inside lists) redacted, and the whole value of a
    secret-named field (``password``, ``api_token``, ...) masked."""

    def one(value: Any) -> Any:
        if isinstance(value, str):
            return redact(value)
        if isinstance(value, list | tuple):
            return [one(v) for v in value]
        if isinstance(value, Mapping):
            return redact_fields(value)
        return value

    return {
        key: MASK if isinstance(value, str) and value and _SECRET_NAME.search(str(key)) else one(value)
        for key, value in values.items()
    }


class _RedactingStream(io.TextIOBase):
    """A text stream that redacts what it writes to ``target`` (one write at a time)."""

    def __init__(self, target: TextIO) -> None:
        self._target = target

    def write(self, text: str) -> int:
        self._target.write(redact(text))
        return len(text)

    def flush(self) -> None:
        self._target.flush()

    def fileno(self) -> int:
        return self._target.fileno()

    def isatty(self) -> bool:
        return self._target.isatty()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self._target.encoding


class _RedactingFilter(logging.Filter):
    """Redact a record's message and traceback before any handler formats it."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = redact(record.getMessage()), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True


def install() -> None:
    """Route this process's stdout, stderr and log handlers through :func:`redact` (idempotent)."""
    if not isinstance(sys.stdout, _RedactingStream):
        sys.stdout = _RedactingStream(sys.stdout)
    if not isinstance(sys.stderr, _RedactingStream):
        sys.stderr = _RedactingStream(sys.stderr)
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, _RedactingFilter) for f in handler.filters):
            handler.addFilter(_RedactingFilter())
