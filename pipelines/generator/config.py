"""Parameters of a synthetic world: what the user asks for and what follows from it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pipelines.durations import DAY_MS

DEFAULT_START = datetime(2026, 5, 1, tzinfo=UTC)

#: Rough number of events a user produces per day on average (impressions plus
#: engagement). With 20,000 users and 14 days that is about 1M events: ~50 events
#: per user, median ~25, a few power users above 20,000.
EVENTS_PER_USER_DAY = 3.6

DEFAULT_CATEGORIES = 32

#: Above this many expected events the generator refuses to start (memory).
MAX_EXPECTED_EVENTS = 250_000_000


@dataclass(frozen=True)
class WorldConfig:
    """Everything that determines a world; the same config always gives the same bytes.

    ``start_ms`` is the first millisecond of the period (UTC); the period lasts
    ``days`` days. Item counts scale with the number of users unless given.
    """

    users: int
    days: int
    seed: int = 0
    start_ms: int = int(DEFAULT_START.timestamp() * 1000)
    categories: int = DEFAULT_CATEGORIES
    segments: int = 12
    organic_items: int = 0
    ads: int = 0
    advertisers: int = 0
    #: Opt-in "niche" interests (0 = off, the default world): each user also likes their
    #: least-interesting category this much (affinity, 1 = indifferent) but is shown it only
    #: ``niche_exposure`` of the time, so evidence of it is sparse and mostly old: only a long
    #: history holds it. A world where old interests matter, for context-length comparisons.
    niche_affinity: float = 0.0
    niche_exposure: float = 0.03

    def __post_init__(self) -> None:
        if self.users <= 0:
            raise ValueError(f"users must be positive, got {self.users}")
        if self.days <= 0:
            raise ValueError(f"days must be positive, got {self.days}")
        if not 0 <= self.seed < 2**32:
            raise ValueError(f"seed must be in [0, 2**32), got {self.seed}")
        if self.start_ms < 0:
            raise ValueError(f"start_ms must be non-negative, got {self.start_ms}")
        if not 2 <= self.categories <= 256 or not 1 <= self.segments <= self.categories:
            raise ValueError("need 2 <= categories <= 256 and 1 <= segments <= categories")
        for name in ("organic_items", "ads"):
            if getattr(self, name) and getattr(self, name) < self.categories:
                raise ValueError(f"{name} must be 0 (derived from users) or at least categories")
        if self.advertisers < 0:
            raise ValueError("advertisers must be non-negative (0 = derived from ads)")
        if self.niche_affinity != 0 and not 1 <= self.niche_affinity <= self.categories:
            raise ValueError(f"niche_affinity must be 0 (off) or in [1, categories], got {self.niche_affinity}")
        if not 0 <= self.niche_exposure <= 0.5:
            raise ValueError(f"niche_exposure must be in [0, 0.5], got {self.niche_exposure}")

    @property
    def end_ms(self) -> int:
        """The first millisecond after the period."""
        return self.start_ms + self.days * DAY_MS

    @property
    def expected_events(self) -> float:
        return self.users * self.days * EVENTS_PER_USER_DAY

    @property
    def num_organic(self) -> int:
        return self.organic_items or int(min(max(self.users * 2, 2_000), 500_000))

    @property
    def num_ads(self) -> int:
        return self.ads or int(min(max(self.users // 4, 500), 50_000))

    @property
    def num_advertisers(self) -> int:
        # At least one advertiser per category, so that every category has ads.
        wanted = self.advertisers or self.num_ads // 8
        return int(min(max(wanted, self.categories), self.num_ads))

    def to_json(self) -> dict[str, Any]:
        """The parameters as written into world.json (derived counts included)."""
        out = dataclasses.asdict(self)
        out.update(
            start=datetime.fromtimestamp(self.start_ms / 1000, tz=UTC).isoformat(),
            end=datetime.fromtimestamp(self.end_ms / 1000, tz=UTC).isoformat(),
            end_ms=self.end_ms,
            organic_items=self.num_organic,
            ads=self.num_ads,
            advertisers=self.num_advertisers,
            events_per_user_day=EVENTS_PER_USER_DAY,
        )
        return out
