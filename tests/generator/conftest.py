"""Small generated worlds shared by the generator tests (each is generated once)."""

from __future__ import annotations

import pytest

from pipelines.generator import GeneratedEvents, WorldConfig, generate_events

SMALL = WorldConfig(users=400, days=5, seed=3)
#: Big enough for distributions (about 145k events), still well under a second.
MEDIUM = WorldConfig(users=3000, days=14, seed=11)


@pytest.fixture(scope="session")
def small() -> GeneratedEvents:
    return generate_events(SMALL)


@pytest.fixture(scope="session")
def medium() -> GeneratedEvents:
    return generate_events(MEDIUM)
