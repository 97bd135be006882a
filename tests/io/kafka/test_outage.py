"""The broker watch (pure): one log line per state change, and a bound on how long an outage is ridden out."""

from __future__ import annotations

import logging

import pytest

from pipelines.io.kafka.outage import BrokerUnavailableError, BrokerWatch, LazyClient


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_an_outage_is_logged_once_when_it_starts_and_once_when_it_ends(caplog: pytest.LogCaptureFixture) -> None:
    clock = _Clock()
    watch = BrokerWatch("127.0.0.1:1", limit_s=60, clock=clock)
    caplog.set_level(logging.INFO, logger="pipelines.io.kafka.outage")
    watch.ok()
    for _ in range(50):  # every client of the job fails, many times a second
        watch.failed(ConnectionRefusedError("refused"))
        clock.now += 0.5
    assert watch.down and watch.down_for() == pytest.approx(25)
    watch.ok()
    watch.ok()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert "127.0.0.1:1 unreachable (ConnectionRefusedError: refused)" in lines[0] and "60 s" in lines[0]
    assert lines[1] == "kafka: 127.0.0.1:1 back after 25 s"
    assert not watch.down and watch.down_for() == 0


def test_an_outage_longer_than_the_limit_fails_naming_the_fix() -> None:
    clock = _Clock()
    watch = BrokerWatch("127.0.0.1:1", limit_s=30, clock=clock)
    watch.failed(TimeoutError("no answer"))
    clock.now += 30
    watch.failed(TimeoutError("no answer"))  # at the limit: still ridden out
    clock.now += 1
    assert watch.expired()
    with pytest.raises(BrokerUnavailableError, match="unreachable for 31 s") as raised:
        watch.failed(TimeoutError("no answer"))
    assert "Fix:" in str(raised.value) and "--broker-timeout" in str(raised.value)


def test_a_lazy_client_is_made_on_first_use_and_a_failed_make_is_tried_again() -> None:
    made: list[int] = []

    class _Client:
        closed = False

        def close(self) -> None:
            self.closed = True

    def make() -> _Client:
        made.append(1)
        if len(made) == 1:
            raise ConnectionRefusedError("broker away")
        return _Client()

    lazy = LazyClient(make)
    assert made == []  # nothing connects at construction (a DoFn's setup)
    with pytest.raises(ConnectionRefusedError):
        lazy.get()
    client = lazy.get()
    assert lazy.get() is client and len(made) == 2
    lazy.close()
    assert client.closed
