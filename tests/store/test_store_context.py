"""Users' context records on every backend: written next to the representations, read in the same
round trip, with the representations' newest-wins, staleness and expiry."""

from __future__ import annotations

import time

import numpy as np
import pytest

from pipelines.store import ManualClock, OnlineStore, WriteReport
from pipelines.store.codec import decode_context, encode_contexts
from tests.conftest import MakeStore
from tests.store.reps import T0_MS, T0_S, reps


def _write(store: OnlineStore, users: list[int], payloads: list[bytes], at_ms: int) -> WriteReport:
    return store.write_contexts(
        np.array(users), payloads, model_version="ctx-v1", computed_at_ms=np.full(len(users), at_ms)
    )


def test_context_is_read_with_the_request_and_leaves_the_representations_alone(make_store: MakeStore) -> None:
    store = make_store(clock=ManualClock(T0_S + 30))
    store.write_batch(reps([(1, None), (1, 10), (1, 11), (2, None)]))
    report = _write(store, [1, 2], [b"user one", b"two" * 100], T0_MS)
    assert (report.written, report.skipped_older) == (2, 0)
    got = store.read_for_request(1, [10, 11, 12], with_context=True)
    assert got.context is not None and got.context.found
    assert got.context.payload == b"user one" and got.context.model_version == "ctx-v1"
    assert got.context.age_s == pytest.approx(30)
    assert got.pairs.found.tolist() == [True, True, False] and got.user.found.tolist() == [True]
    assert store.read_for_request(1, [10]).context is None
    assert [c.payload for c in store.read_contexts([2, 3])] == [b"two" * 100, b""]
    assert not store.read_contexts([3])[0].found
    assert store.read_batch([(1, None), (2, None)]).found.all()


def test_newer_context_wins_and_older_is_skipped(make_store: MakeStore) -> None:
    store = make_store(clock=ManualClock(T0_S))
    _write(store, [1], [b"new"], T0_MS)
    assert _write(store, [1], [b"old"], T0_MS - 1000).skipped_older == 1
    assert store.read_contexts([1])[0].payload == b"new"
    _write(store, [1], [b"newer"], T0_MS + 1000)
    assert store.read_contexts([1])[0].payload == b"newer"
    store.clear()
    assert not store.read_contexts([1])[0].found


def test_context_staleness_and_expiry_follow_the_store(make_store: MakeStore) -> None:
    now_ms = int(time.time() * 1000)  # Redis expires by its own clock
    clock = ManualClock(now_ms / 1000)
    store = make_store(clock=clock, max_age_s=60, expire_after_s=3600)
    _write(store, [1], [b"x"], now_ms)
    assert not store.read_contexts([1])[0].stale
    clock.advance(600)
    assert store.read_contexts([1])[0].stale and store.read_contexts([1])[0].found
    clock.advance(3600)
    context = store.read_for_request(1, [5], with_context=True).context
    assert context is not None and not context.found


def test_context_codec_refuses_a_representation_record() -> None:
    value = encode_contexts([b"abc"], np.array([7], np.uint64), np.array([T0_MS]), np.array([0]))[0]
    head, payload = decode_context(value)
    assert payload == b"abc" and int(head["computed_at_ms"]) == T0_MS
    with pytest.raises(ValueError, match="not a context record"):
        decode_context(b"\x01" + value[1:])
    with pytest.raises(ValueError, match="truncated"):
        decode_context(value[:-1])
