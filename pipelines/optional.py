"""Imports of optional dependencies, failing with the extra that installs them.

A plain ``pip install gem-pipelines`` leaves out Kafka, Redis, matplotlib and FAISS
(pyproject.toml's extras ``kafka``, ``redis``, ``plot``, ``cpu``/``gpu``). The modules that
need one import it through :func:`require`, so a missing one reads as
``pip install 'gem-pipelines[redis]'`` rather than a bare ``ModuleNotFoundError``::

    faiss = require("faiss", ("cpu", "gpu"), "similarity indexes")
    redis = require_on_use("redis", "redis", "the redis:// store")   # imported with every store
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import NoReturn

from pipelines.errors import PipelinesError

__all__ = ["MissingExtraError", "require", "require_on_use"]


class MissingExtraError(PipelinesError, ImportError):
    """An optional dependency is not installed; the message names the extra that brings it."""

    def __init__(self, module: str, extra: str | tuple[str, ...], purpose: str) -> None:
        extras = (extra,) if isinstance(extra, str) else extra
        self.module = module
        self.extras = extras
        fix = " or ".join(f"pip install 'gem-pipelines[{name}]'" for name in extras)
        super().__init__(
            f"{purpose} needs the Python module {module!r}, which is not installed. Fix: {fix}", name=module
        )


def require(module: str, extra: str | tuple[str, ...], purpose: str) -> ModuleType:
    """Import ``module`` now, or raise :class:`MissingExtraError` naming ``extra``.

    Only the module itself (or its package) being absent is translated: an installed
    module that fails on an import of its own is a broken install and raises unchanged.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if not _is_absent(module, exc):
            raise
        raise MissingExtraError(module, extra, purpose) from exc


def require_on_use(module: str, extra: str | tuple[str, ...], purpose: str) -> ModuleType:
    """``module`` if it is installed, else a stand-in raising :class:`MissingExtraError` on first use.

    For a module imported by code that every install loads (the Redis backend comes with
    ``pipelines.store``, which the embedded LMDB store needs too): the error waits until
    the optional part is actually used.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if not _is_absent(module, exc):
            raise
        return _Absent(module, extra, purpose, exc)


def _is_absent(module: str, exc: ModuleNotFoundError) -> bool:
    return exc.name is not None and (module == exc.name or module.startswith(exc.name + "."))


class _Absent(ModuleType):
    """Stands for an uninstalled module; any attribute read raises :class:`MissingExtraError`."""

    def __init__(self, module: str, extra: str | tuple[str, ...], purpose: str, cause: ModuleNotFoundError):
        super().__init__(module)
        self._missing = (module, extra, purpose, cause)

    def __getattr__(self, name: str) -> NoReturn:
        if name.startswith("__"):  # protocol probes (hasattr(m, "__path__"), copy, pickle) see a plain module
            raise AttributeError(name)
        module, extra, purpose, cause = self._missing
        raise MissingExtraError(module, extra, purpose) from cause
