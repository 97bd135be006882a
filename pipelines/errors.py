"""The project's exceptions: a small hierarchy with messages that name the fix."""

from __future__ import annotations


class PipelinesError(Exception):
    """Base class of every error this project raises on purpose."""


class ConfigError(PipelinesError, ValueError):
    """A flag or option is wrong. Raised at construction, before any work starts."""

    def __init__(self, flag: str, problem: str, fix: str) -> None:
        self.flag = flag
        super().__init__(f"{flag}: {problem}. Fix: {fix}")


class InputNotFoundError(PipelinesError, FileNotFoundError):
    """An input path or glob matched nothing."""


class OutputNotWritableError(PipelinesError, PermissionError):
    """An output location cannot be written."""


class LayoutError(PipelinesError, ValueError):
    """A file does not have the record layout (or version) that a stage expects."""


class BadInputError(PipelinesError):
    """An input file cannot be read to its end: truncated or non-gzip compression, not Parquet,
    a schema the layouts cannot take. The message names the file and how far reading got."""


class OutputLockedError(PipelinesError):
    """Another run is writing the same output folder right now."""


class SnapshotError(PipelinesError):
    """A folder is not a committed snapshot, or its files are not the ones committed."""
