"""Niche interests (WorldConfig.niche_affinity): liked but rarely shown, so only long histories reveal them."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from pipelines.generator import GeneratedEvents, WorldConfig, generate_events
from pipelines.schemas.enums import EVENT_TYPE_CODE

from .conftest import SMALL

NICHE = WorldConfig(users=3000, days=14, seed=11, niche_affinity=16.0, niche_exposure=0.03)


@pytest.fixture(scope="module")
def niche() -> GeneratedEvents:
    return generate_events(NICHE)


def _impressions(generated: GeneratedEvents) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(user index, category, clicked) of every impression; clicked: the user clicked that item at some point."""
    events = generated.events
    kind = events["event_type"].to_numpy()
    user = events["user_id"].to_numpy() - 1
    category = events["item_category"].to_numpy()
    item = events["item_id"].to_numpy()
    shown = kind == EVENT_TYPE_CODE["impression"]
    click = kind == EVENT_TYPE_CODE["click"]
    clicks = {(int(u), int(i)) for u, i in zip(user[click], item[click], strict=True)}
    clicked = np.array([(int(u), int(i)) in clicks for u, i in zip(user[shown], item[shown], strict=True)])
    return user[shown], category[shown], clicked


def test_the_default_world_has_no_niche_and_ignores_the_exposure() -> None:
    default = generate_events(SMALL)
    assert np.all(default.world.users.niche == -1)
    other_exposure = generate_events(dataclasses.replace(SMALL, niche_exposure=0.2))
    assert other_exposure.events.equals(default.events)


def test_the_niche_is_the_least_interesting_category(niche: GeneratedEvents) -> None:
    users = niche.world.users
    assert np.array_equal(users.niche, users.interest.argmin(axis=1))


def test_niche_impressions_are_rare_and_clicked_like_a_main_interest(niche: GeneratedEvents) -> None:
    user, category, clicked = _impressions(niche)
    users = niche.world.users
    is_niche = category == users.niche[user]
    # shown at about niche_exposure (plus the odd exploration draw), far more than before
    assert 0.02 < is_niche.mean() < 0.05
    without = _impressions(generate_events(dataclasses.replace(NICHE, niche_affinity=0.0)))
    assert (without[1] == users.niche[without[0]]).mean() < 0.01
    # clicked far more than the users' other low-interest categories, like their top ones
    share = users.interest[user, category]
    low = ~is_niche & (share < np.quantile(users.interest, 0.25))
    top = ~is_niche & (share > np.quantile(users.interest, 0.9))
    assert clicked[is_niche].mean() > 3 * clicked[low].mean()
    assert clicked[is_niche].mean() > 0.7 * clicked[top].mean()


def test_bad_niche_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="niche_affinity"):
        WorldConfig(users=10, days=1, niche_affinity=0.5)
    with pytest.raises(ValueError, match="niche_exposure"):
        WorldConfig(users=10, days=1, niche_affinity=8, niche_exposure=0.7)
