"""The one check every writing command makes of its ``--output`` before any work.

An output never resolves to an input: publishing replaces the output folder whole, so an output
that is an input, holds one or lies inside one would destroy what the run reads (or what the next
run would read). Paths are compared by their real path (symlinks resolved), so a second name of
the same folder is caught too. A folder output that exists as a file is refused always, with or
without ``--overwrite``: nothing the user named as a file is ever moved aside or replaced by a folder.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from pipelines.errors import ConfigError

__all__ = ["check_output", "store_path"]


def _real(path: str) -> str:
    """A comparable form of ``path``: the real path of a local one, the URI without a trailing slash otherwise."""
    if "://" in path and not path.startswith("file://"):
        return path.rstrip("/")
    return os.path.realpath(path.removeprefix("file://").rstrip("/") or "/")


def _within(inner: str, outer: str) -> bool:
    return inner.startswith(outer.rstrip("/") + "/")


def check_output(
    output: str, inputs: Iterable[tuple[str, str | None]] = (), *, flag: str = "--output", folder: bool = True
) -> None:
    """Refuse ``output`` (named by ``flag``) when it is, holds or lies inside one of ``inputs``
    (``(flag, path)`` pairs; None paths are skipped), or, for a ``folder`` output, when it exists
    and is not a folder. :class:`ConfigError` naming both flags and the fix."""
    real = _real(output)
    for input_flag, path in inputs:
        if not path:
            continue
        given = _real(path)
        if given == real:
            problem = f"{output!r} is {input_flag} {path!r}"
        elif _within(given, real):
            problem = f"{output!r} holds {input_flag} {path!r} (publishing replaces the whole folder)"
        elif _within(real, given):
            problem = f"{output!r} lies inside {input_flag} {path!r}"
        else:
            continue
        raise ConfigError(flag, problem, f"write to a new folder outside every input (never over {input_flag})")
    if folder and "://" not in real and os.path.lexists(real) and not os.path.isdir(real):
        raise ConfigError(
            flag,
            f"{output!r} is an existing file, and this command writes a folder there",
            "name a new folder or an earlier output of this command; an existing file is never moved aside",
        )


def store_path(uri: str | None) -> str | None:
    """The directory of an LMDB ``--store`` (``lmdb://DIR?...`` or a plain path), None for other stores."""
    if not uri or uri.split(":", 1)[0].lower() in ("redis", "rediss"):
        return None
    return uri.removeprefix("lmdb://").split("?", 1)[0] or None
