"""Every record layout of the project, with its version.

This module is the single source of truth: readers and writers import the schemas
from here, and every Parquet file carries the layout name and version in its
metadata (see :func:`with_layout_metadata`). Change a layout only together with
its version; ``tests/schemas/test_layouts.py`` fails otherwise.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import pyarrow as pa

from pipelines.schemas.enums import EVENT_TYPES, SURFACES

NAME_KEY = b"gem.layout"
VERSION_KEY = b"gem.layout_version"

TIME = pa.timestamp("ms", tz="UTC")
ENUM = pa.int8()
DEFAULT_EMBEDDING_DIM = 64


@dataclass(frozen=True)
class Layout:
    """A named, versioned Arrow schema."""

    name: str
    version: int
    schema: pa.Schema
    #: A fixed-size list column whose size a file may choose (the representation's embedding dim).
    sized_by: str | None = None

    def schema_for(self, data: pa.Schema) -> pa.Schema:
        """The layout's schema for data shaped like ``data``: a ``sized_by`` column keeps its size."""
        if self.sized_by is None or self.sized_by not in data.names:
            return self.schema
        size = data.field(self.sized_by).type.list_size
        index = self.schema.get_field_index(self.sized_by)
        field = self.schema.field(index)
        return self.schema.set(index, field.with_type(pa.list_(field.type.value_type, size)))

    def with_metadata(self, schema: pa.Schema | None = None) -> pa.Schema:
        """``schema`` (default: the layout's) with the layout name and version in its metadata."""
        schema = self.schema if schema is None else schema
        meta = dict(schema.metadata or {})
        meta[NAME_KEY] = self.name.encode()
        meta[VERSION_KEY] = str(self.version).encode()
        return schema.with_metadata(meta)

    def fingerprint(self) -> str:
        """A digest of the field names, types and nullability (not metadata)."""
        text = "|".join(f"{f.name}:{f.type}:{f.nullable}" for f in self.schema)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


EVENT = Layout(
    "event",
    1,
    pa.schema(
        [
            pa.field("event_id", pa.string(), nullable=False),
            pa.field("user_id", pa.int64(), nullable=False),
            pa.field("item_id", pa.int64(), nullable=False),
            pa.field("is_ad", pa.bool_(), nullable=False),
            pa.field("advertiser_id", pa.int64()),
            pa.field("item_category", pa.int32(), nullable=False),
            pa.field("surface", ENUM, nullable=False),
            pa.field("event_type", ENUM, nullable=False),
            pa.field("event_time", TIME, nullable=False),
            pa.field("value", pa.float32()),
            pa.field("device", ENUM),
        ]
    ),
)

#: One event inside a history: the event without the user, which is the row's key.
HISTORY_EVENT = pa.struct([f for f in EVENT.schema if f.name not in ("user_id", "device")])

HISTORY_SUMMARY = pa.struct(
    [
        pa.field("evicted_count", pa.int64(), nullable=False),
        pa.field("surface_counts", pa.list_(pa.int64(), len(SURFACES)), nullable=False),
        pa.field("event_type_counts", pa.list_(pa.int64(), len(EVENT_TYPES)), nullable=False),
        pa.field("first_event_time", TIME),
        pa.field("last_event_time", TIME),
    ]
)

HISTORY = Layout(
    "history",
    1,
    pa.schema(
        [
            pa.field("user_id", pa.int64(), nullable=False),
            pa.field("events", pa.list_(pa.field("item", HISTORY_EVENT, nullable=False)), nullable=False),
            pa.field("summary", HISTORY_SUMMARY, nullable=False),
            pa.field("num_events_total", pa.int64(), nullable=False),
            pa.field("last_event_time", TIME, nullable=False),
            pa.field("watermark", TIME, nullable=False),
        ]
    ),
)

TRAINING_EXAMPLE = Layout(
    "training_example",
    1,
    pa.schema(
        [
            pa.field("event_id", pa.string(), nullable=False),
            pa.field("user_id", pa.int64(), nullable=False),
            pa.field("item_id", pa.int64(), nullable=False),
            pa.field("is_ad", pa.bool_(), nullable=False),
            pa.field("advertiser_id", pa.int64()),
            pa.field("item_category", pa.int32(), nullable=False),
            pa.field("surface", ENUM, nullable=False),
            pa.field("device", ENUM),
            pa.field("event_time", TIME, nullable=False),
            pa.field("clicked", pa.bool_(), nullable=False),
            pa.field("converted", pa.bool_(), nullable=False),
            # Number of the user's events strictly before event_time, evicted ones included.
            pa.field("history_length", pa.int64(), nullable=False),
            # Exclusive end of that prefix inside the snapshot's stored `events` list.
            pa.field("history_end", pa.int32(), nullable=False),
        ]
    ),
)

CANDIDATES = Layout(
    "candidates",
    1,
    pa.schema(
        [
            pa.field("request_id", pa.string(), nullable=False),
            pa.field("user_id", pa.int64(), nullable=False),
            pa.field("surface", ENUM, nullable=False),
            pa.field("request_time", TIME, nullable=False),
            pa.field("ad_ids", pa.list_(pa.field("item", pa.int64(), nullable=False)), nullable=False),
        ]
    ),
)

# One stage of one ad request in the ranking funnel (``generate --funnel``; the candidates topic).
# A request has a row per stage, each stage's ads a subset of the previous one's, so a funnel
# file is also its ground truth: which ads reached which stage, and when.
CANDIDATE_SET = Layout(
    "candidate_set",
    1,
    pa.schema(
        [
            pa.field("request_id", pa.string(), nullable=False),
            pa.field("user_id", pa.int64(), nullable=False),
            pa.field("surface", ENUM, nullable=False),
            # pipelines.schemas.enums.FUNNEL_STAGES code: retrieval, early, late, auction
            pa.field("stage", ENUM, nullable=False),
            # When this stage handed its ads on (the candidate set exists from then).
            pa.field("stage_time", TIME, nullable=False),
            # When the late stage needs the pairs' representations: the request's deadline.
            pa.field("needed_by", TIME, nullable=False),
            pa.field("ad_ids", pa.list_(pa.field("item", pa.int64(), nullable=False)), nullable=False),
        ]
    ),
)


def representation_schema(dim: int = DEFAULT_EMBEDDING_DIM) -> pa.Schema:
    """The representation layout for embeddings of ``dim`` values.

    ``embedding`` holds float16 values, or int8 values when ``embedding_scale`` is
    set (value = int8 * scale). ``ad_id`` is null for a user-level representation.
    """
    if dim <= 0:
        raise ValueError(f"embedding dim must be positive, got {dim}")
    return pa.schema(
        [
            pa.field("user_id", pa.int64(), nullable=False),
            pa.field("ad_id", pa.int64()),
            pa.field("embedding", pa.list_(pa.float16(), dim), nullable=False),
            pa.field("embedding_scale", pa.float32()),
            pa.field("p_click", pa.float32(), nullable=False),
            pa.field("p_conversion", pa.float32(), nullable=False),
            pa.field("model_version", pa.string(), nullable=False),
            pa.field("history_watermark", TIME),
            pa.field("computed_at", TIME, nullable=False),
        ]
    )


REPRESENTATION = Layout("representation", 1, representation_schema(), sized_by="embedding")

DEAD_LETTER = Layout(
    "dead_letter",
    1,
    pa.schema(
        [
            pa.field("stage", pa.string(), nullable=False),
            pa.field("reason", pa.string(), nullable=False),
            pa.field("detail", pa.string(), nullable=False),
            pa.field("payload", pa.binary(), nullable=False),
            pa.field("source", pa.string(), nullable=False),
        ]
    ),
)

# The generator's ground truth (``X.truth/users.parquet``, ``items.parquet``): read by tests and
# evaluations, never by a pipeline stage.
TRUTH_USERS = Layout(
    "truth_users",
    1,
    pa.schema(
        [
            pa.field("user_id", pa.int64(), nullable=False),
            pa.field("segment", pa.int32(), nullable=False),
            # Interest over item categories (index = item_category); sums to 1.
            pa.field("interest", pa.list_(pa.field("item", pa.float32(), nullable=False)), nullable=False),
            pa.field("preferred_surface", pa.int8(), nullable=False),
            pa.field("preferred_device", pa.int8(), nullable=False),
            # Expected events per day (power law).
            pa.field("activity", pa.float64(), nullable=False),
        ]
    ),
)

TRUTH_ITEMS = Layout(
    "truth_items",
    1,
    pa.schema(
        [
            pa.field("item_id", pa.int64(), nullable=False),
            pa.field("is_ad", pa.bool_(), nullable=False),
            pa.field("advertiser_id", pa.int64()),
            pa.field("item_category", pa.int32(), nullable=False),
            # Share of impressions within its kind (ads or organic) at equal interest.
            pa.field("popularity", pa.float64(), nullable=False),
        ]
    ),
)

# Row position in a FAISS index → user id (``ids.parquet`` of an index folder).
ID_MAP = Layout(
    "similarity_id_map",
    1,
    pa.schema([pa.field("position", pa.int64(), nullable=False), pa.field("user_id", pa.int64(), nullable=False)]),
)

# As-of representation features of the transfer stage (``transfer --output DIR``: ``asof/``): one row
# per (as-of setting, example) with what serving would hand a downstream model at the impression.
ASOF_FEATURES = Layout(
    "asof_features",
    1,
    pa.schema(
        [
            pa.field("setting", pa.string(), nullable=False),
            pa.field("split", pa.string(), nullable=False),
            # Row of the example in its split's sample.
            pa.field("position", pa.int64(), nullable=False),
            pa.field("event_id", pa.string(), nullable=False),
            # Fallback path of the pair slot (pipelines.similarity.policy.PATHS code).
            pa.field("path", pa.int8(), nullable=False),
            # Seconds from the snapshot's computed_at to the impression; null where none was read.
            pa.field("user_age_s", pa.float64()),
            pa.field("pair_age_s", pa.float64()),
            # The user-level representation (zeros where none) and the resolved pair slot.
            pa.field("user_embedding", pa.list_(pa.float32()), nullable=False),
            pa.field("pair_embedding", pa.list_(pa.float32()), nullable=False),
        ]
    ),
)


def rep_history_schema(dim: int = DEFAULT_EMBEDDING_DIM) -> pa.Schema:
    """Historical representations (LoopFM) for embeddings of ``dim`` values: per user, the model's
    pair representation of each kept history event as of that event (``position``: the event's
    place in the user's stored ``events`` list), oldest to newest, float16 values."""
    if dim <= 0:
        raise ValueError(f"embedding dim must be positive, got {dim}")
    event = pa.struct(
        [
            pa.field("position", pa.int32(), nullable=False),
            pa.field("event_time", TIME, nullable=False),
            pa.field("embedding", pa.list_(pa.float16(), dim), nullable=False),
        ]
    )
    return pa.schema(
        [
            pa.field("user_id", pa.int64(), nullable=False),
            pa.field("events", pa.list_(pa.field("item", event, nullable=False)), nullable=False),
        ]
    )


REP_HISTORY = Layout("rep_history", 1, rep_history_schema())

LAYOUTS: dict[str, Layout] = {
    layout.name: layout
    for layout in (
        EVENT,
        HISTORY,
        TRAINING_EXAMPLE,
        CANDIDATES,
        CANDIDATE_SET,
        REPRESENTATION,
        DEAD_LETTER,
        TRUTH_USERS,
        TRUTH_ITEMS,
        ID_MAP,
        ASOF_FEATURES,
        REP_HISTORY,
    )
}


def layout_of(schema: pa.Schema) -> tuple[str, int] | None:
    """The (name, version) written in a schema's metadata, or None."""
    meta = schema.metadata or {}
    if NAME_KEY not in meta:
        return None
    return meta[NAME_KEY].decode(), int(meta.get(VERSION_KEY, b"0"))
