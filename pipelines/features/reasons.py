"""Dead-letter reason codes of the features stage (short and stable), each with when it applies.

:data:`WHEN` is the one description of each code: the documentation site's reference page is
generated from it.
"""

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

#: code -> when a record gets it (``features``, ``replay`` and ``stream``: one decoder for files and
#: Kafka; Parquet is checked by the same rules, column-wise).
WHEN: dict[str, str] = {
    INVALID_JSON: "not JSON (a line cut short, two objects on one line, nesting deeper than Python's `json` allows)",
    INVALID_UTF8: "bytes that are not UTF-8, or a `\\ud800`-style unpaired surrogate in `event_id`",
    NUL_BYTE: "a NUL byte in the line",
    LINE_TOO_LONG: "a line over 1 MiB (payload kept truncated to 64 KiB)",
    NON_FINITE: "`NaN`, `Infinity`, or a number that overflows to infinity (`1e400`)",
    DUPLICATE_KEY: (
        'a key appears twice in one object, at any depth (`"user_id":1,"user_id":999`): never "the last one wins"'
    ),
    NOT_AN_OBJECT: "valid JSON that is not an object (`42`, `[1]`, `null`)",
    MISSING_FIELD: "a required field is absent (Parquet: a required column absent, or null in that row)",
    WRONG_TYPE: (
        'a field of the wrong JSON type (`"user_id": "7"`, `"is_ad": 1`); '
        "Parquet columns of a type the rules cannot read"
    ),
    OUT_OF_RANGE: (
        "ids negative or above 2^63-1 (also a Parquet `uint64` above it, per row), `item_category` above "
        "2^31-1, `value` beyond float32, `event_id` empty or over 256 characters, an integer of more than "
        "4,300 digits (Python's limit)"
    ),
    UNKNOWN_ENUM: "`surface`, `event_type`, `device` not one of the lower-case values",
    BAD_TIMESTAMP: (
        "`event_time` a float, negative, after 9999, an ISO string without a timezone, "
        "or shifted off the calendar by its offset"
    ),
    FUTURE_TIME: (
        "`event_time` later than the run's clock plus `--max-future` (`stream`: the job's clock when the "
        "batch is decoded), so no event moves a watermark past now"
    ),
    AD_WITHOUT_ADVERTISER: "`is_ad` true and no `advertiser_id`",
    ORGANIC_WITH_ADVERTISER: "`is_ad` false and an `advertiser_id`",
    UNEXPECTED_ERROR: (
        "an exception no rule foresaw (logged as a warning, with its type): the record is dead-lettered, "
        "the run goes on"
    ),
    UNREADABLE_FILE: (
        "with `--skip-bad-files` only: one per bad file (`source` = the path, `detail` = what was wrong "
        "and how far reading got)"
    ),
}
