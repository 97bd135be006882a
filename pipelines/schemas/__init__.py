"""Record layouts of the GEM feature and representation pipelines (single source of truth)."""

from __future__ import annotations

from pipelines.schemas.enums import (
    CONVERSION_TYPES,
    DEVICE_CODE,
    DEVICES,
    EVENT_TYPE_CODE,
    EVENT_TYPES,
    SURFACE_CODE,
    SURFACES,
)
from pipelines.schemas.layouts import (
    CANDIDATES,
    DEAD_LETTER,
    EVENT,
    HISTORY,
    ID_MAP,
    LAYOUTS,
    REPRESENTATION,
    TRAINING_EXAMPLE,
    TRUTH_ITEMS,
    TRUTH_USERS,
    Layout,
    layout_of,
    representation_schema,
)

__all__ = [
    "CANDIDATES",
    "CONVERSION_TYPES",
    "DEAD_LETTER",
    "DEVICES",
    "DEVICE_CODE",
    "EVENT",
    "EVENT_TYPES",
    "EVENT_TYPE_CODE",
    "HISTORY",
    "ID_MAP",
    "LAYOUTS",
    "REPRESENTATION",
    "SURFACES",
    "SURFACE_CODE",
    "TRAINING_EXAMPLE",
    "TRUTH_ITEMS",
    "TRUTH_USERS",
    "Layout",
    "layout_of",
    "representation_schema",
]
