"""What the streaming job reads and writes (:class:`StreamConfig`), validated on construction."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from pipelines.errors import ConfigError
from pipelines.io.kafka.outage import DEFAULT_LIMIT_S
from pipelines.schemas.enums import FUNNEL_STAGE_CODE, FUNNEL_STAGES
from pipelines.settings import (
    CANDIDATE_TTL,
    ENCODING_CACHE,
    ENCODING_MAX_AGE,
    FLUSH_INTERVAL,
    MAX_FUTURE,
    MAX_HISTORY,
    NUM_SHARDS,
    PAIR_MAX_AGE,
)

__all__ = ["StreamConfig"]


@dataclass(frozen=True)
class StreamConfig:
    """What the streaming job reads and writes; validated on construction."""

    topic: str
    output: str
    group: str
    num_shards: int = NUM_SHARDS.default
    max_history: int = MAX_HISTORY.default
    flush_interval_s: float = FLUSH_INTERVAL.seconds
    idle_exit_s: float | None = None
    #: How long the broker may stay unreachable before the job fails (it retries until then).
    broker_timeout_s: float = DEFAULT_LIMIT_S
    histories_topic: str | None = None
    dead_letter_topic: str | None = None
    model: str | None = None
    store: str | None = None
    candidates: tuple[str, ...] = ()
    candidate_ttl_s: float = CANDIDATE_TTL.seconds
    #: A topic of candidate sets (CANDIDATE_SET JSON), read beside the events: the sets of ``stage``
    #: meet their user's keyed state and get their pair representations (needs ``model`` and ``store``).
    candidates_topic: str | None = None
    stage: str = "early"
    #: Still compute a set this long after its ``needed_by`` (0: a late set is dropped, counted).
    deadline_grace_s: float = 0.0
    #: A stored pair younger than this, on the user's current history, is not computed again.
    pair_max_age_s: float = PAIR_MAX_AGE.seconds
    #: An ad catalog (Parquet: item_id, advertiser_id, item_category) the pairs' ads are looked up
    #: in first; ads only the histories know are learned as they flow.
    ad_catalog: str | None = None
    #: Users whose user-side encoding a pairs worker keeps for their next set (0: none), and for how long.
    encoding_cache: int = ENCODING_CACHE.default
    encoding_max_age_s: float = ENCODING_MAX_AGE.seconds
    #: Keep each user's historical representations of their newest N events (0: none; needs ``model``).
    rep_history: int = 0
    device: str = "auto"
    torch_threads: int = 1
    #: Events later than the job's clock plus this become ``future_time`` dead letters.
    max_future_s: float = MAX_FUTURE.seconds
    #: Whether the runner checkpoints the keyed state (Flink): offsets are then committed once a
    #: checkpoint covering them completes, and a partition's read never ends by itself (the driver
    #: ends the job). Without (Prism): committed once acknowledged; a quiet committed read ends.
    checkpointed: bool = False
    #: Metadata of every offset commit: which output the commits belong to
    #: (:func:`pipelines.streaming.ownership.commit_metadata`).
    commit_metadata: str = ""
    #: The job's clock (seconds since the epoch), read once per decoded batch; injectable for tests.
    clock: Callable[[], float] = time.time

    @property
    def flush_on_arrival(self) -> bool:
        """``--flush-interval 0``: a user's events are merged as each polled batch of them arrives, with
        no buffer and no timer (the lowest latency; a busy user's events coalesce only within a poll)."""
        return self.flush_interval_s == 0

    def max_time_ms(self) -> int:
        """The latest event time accepted now."""
        return int((self.clock() + self.max_future_s) * 1000)

    def __post_init__(self) -> None:
        if not self.topic or not self.group:
            raise ConfigError("--group", "a topic and a consumer group are needed", "pass --topic and --group")
        NUM_SHARDS.check(self.num_shards)
        MAX_HISTORY.check(self.max_history)
        if not (self.flush_on_arrival or 0.01 <= self.flush_interval_s <= 3600):
            raise ConfigError(
                "--flush-interval", f"got {self.flush_interval_s}", "pass 0 (each arrival) or 0.01..3600 seconds"
            )
        if not 1 <= self.broker_timeout_s <= 86_400:
            raise ConfigError("--broker-timeout", f"got {self.broker_timeout_s}", "pass 1 s .. 1 d")
        if self.idle_exit_s is not None and self.idle_exit_s <= 0:
            raise ConfigError("--idle-exit", f"got {self.idle_exit_s}", "pass a positive number of seconds")
        if self.rep_history < 0:
            raise ConfigError("--rep-history", f"got {self.rep_history}", "pass 0 (none) or a number of events")
        if self.rep_history and self.model is None:
            raise ConfigError(
                "--rep-history",
                "historical representations are computed with a model",
                "pass --model MODEL_DIR too (the output folder of the train command)",
            )
        if (self.model is None) != (self.store is None) and not (self.rep_history and self.store is None):
            raise ConfigError(
                "--model" if self.model is None else "--store",
                "representations need both a model and a store",
                "pass --model MODEL_DIR and --store URI together, or neither (or --model with --rep-history)",
            )
        if self.candidates and (self.model is None or self.store is None):
            raise ConfigError(
                "--candidates",
                "candidate sets are only read to refresh pair representations",
                "pass --model and --store too, or drop --candidates",
            )
        CANDIDATE_TTL.check(self.candidate_ttl_s)
        ENCODING_CACHE.check(self.encoding_cache)
        ENCODING_MAX_AGE.check(self.encoding_max_age_s)
        self._check_candidates_topic()
        MAX_FUTURE.check(self.max_future_s)
        if self.torch_threads < 1:
            raise ConfigError("--torch-threads", f"got {self.torch_threads}", "pass 1 or more")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ConfigError("--device", f"got {self.device!r}", "pass auto, cpu or cuda")

    def _check_candidates_topic(self) -> None:
        if self.candidates_topic is None:
            return
        if self.model is None or self.store is None:
            raise ConfigError(
                "--candidates-topic",
                "candidate sets are read to write their pair representations",
                "pass --model MODEL_DIR and --store URI too",
            )
        if self.candidates_topic == self.topic:
            raise ConfigError("--candidates-topic", "it is the events topic", "pass the topic of candidate sets")
        if self.stage not in FUNNEL_STAGE_CODE:
            raise ConfigError("--stage", f"got {self.stage!r}", f"pass one of {', '.join(FUNNEL_STAGES)}")
        if self.deadline_grace_s < 0:
            raise ConfigError("--deadline-grace", f"got {self.deadline_grace_s}", "pass 0 or a positive duration")
        PAIR_MAX_AGE.check(self.pair_max_age_s)

    @property
    def topics(self) -> tuple[str, ...]:
        """Every topic the job reads (and commits): the events', then the candidate sets' if any."""
        return (self.topic,) if self.candidates_topic is None else (self.topic, self.candidates_topic)

    @property
    def refresh(self) -> bool:
        """Whether flushed histories go on to the representation refresh (into the store)."""
        return self.model is not None and self.store is not None
