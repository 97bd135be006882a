"""Dead-letter reason codes of the features stage (short, stable, documented in the README)."""

from __future__ import annotations

LINE_TOO_LONG = "line_too_long"
NUL_BYTE = "nul_byte"
INVALID_UTF8 = "invalid_utf8"
INVALID_JSON = "invalid_json"
NON_FINITE = "non_finite_number"
NOT_AN_OBJECT = "not_an_object"
MISSING_FIELD = "missing_field"
WRONG_TYPE = "wrong_type"
OUT_OF_RANGE = "out_of_range"
UNKNOWN_ENUM = "unknown_enum"
BAD_TIMESTAMP = "bad_timestamp"
AD_WITHOUT_ADVERTISER = "ad_without_advertiser"
ORGANIC_WITH_ADVERTISER = "organic_with_advertiser"
DUPLICATE_KEY = "duplicate_key"
FUTURE_TIME = "future_time"
UNEXPECTED_ERROR = "unexpected_error"
UNREADABLE_FILE = "unreadable_file"

ALL: tuple[str, ...] = (
    LINE_TOO_LONG,
    NUL_BYTE,
    INVALID_UTF8,
    INVALID_JSON,
    NON_FINITE,
    NOT_AN_OBJECT,
    MISSING_FIELD,
    WRONG_TYPE,
    OUT_OF_RANGE,
    UNKNOWN_ENUM,
    BAD_TIMESTAMP,
    AD_WITHOUT_ADVERTISER,
    ORGANIC_WITH_ADVERTISER,
    DUPLICATE_KEY,
    FUTURE_TIME,
    UNEXPECTED_ERROR,
    UNREADABLE_FILE,
)
