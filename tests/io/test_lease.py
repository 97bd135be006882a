"""The object-store lock's decision (pipelines.io.lease), as pure logic: which claims still hold."""

from __future__ import annotations

from collections.abc import Callable

from pipelines.io.lease import Claim, Seen, is_dead, live_others

HERE, ELSEWHERE = "host-a|pid:[1]|boot-1", "host-b|pid:[1]|boot-2"


def claim(token: str, *, pid: int = 100, where: str = HERE, lease_s: float = 60.0) -> Claim:
    return Claim(token, pid, where.split("|")[0], where, "2026-12-04T00:00:00+00:00", "5", "test", lease_s)


def seen(token: str, updated: float, *, pid: int = 100, where: str = HERE) -> Seen:
    return Seen(f"s3://b/out/_lock/{token}.json", updated, claim(token, pid=pid, where=where))


def alive_pids(*pids: int) -> Callable[[int, str], bool]:
    return lambda pid, started: pid in pids


def test_a_claim_within_its_lease_holds_and_an_expired_one_does_not() -> None:
    fresh, old = seen("a", 1000.0, where=ELSEWHERE), seen("b", 900.0, where=ELSEWHERE)
    assert not is_dead(fresh, now=1059.0, here=HERE, alive=alive_pids())
    assert is_dead(old, now=961.0, here=HERE, alive=alive_pids())


def test_a_claim_of_a_gone_process_on_this_machine_is_dead_at_once() -> None:
    mine_dead, mine_alive = seen("a", 1000.0, pid=7), seen("b", 1000.0, pid=8)
    assert is_dead(mine_dead, now=1000.0, here=HERE, alive=alive_pids(8))
    assert not is_dead(mine_alive, now=1000.0, here=HERE, alive=alive_pids(8))
    # the same pid on another machine (or pid namespace) is never judged from here
    assert not is_dead(seen("c", 1000.0, pid=7, where=ELSEWHERE), now=1000.0, here=HERE, alive=alive_pids(8))


def test_live_others_leaves_out_the_checker_and_orders_oldest_first() -> None:
    listing = [
        seen("me", 1000.0),
        seen("late", 990.0, where=ELSEWHERE),
        seen("early", 980.0, where=ELSEWHERE),
        seen("gone", 500.0, where=ELSEWHERE),
    ]
    live, dead = live_others(listing, "me", now=1000.0, here=HERE, alive=alive_pids(100))
    assert [s.claim.token for s in live if s.claim] == ["early", "late"]
    assert [s.claim.token for s in dead if s.claim] == ["gone"]


def test_an_unreadable_claim_holds_for_the_default_lease() -> None:
    unreadable = Seen("s3://b/out/_lock/x.json", 1000.0, None)
    live, _ = live_others([unreadable], "me", now=1100.0, here=HERE, alive=alive_pids())
    assert live == [unreadable]
    assert is_dead(unreadable, now=1121.0, here=HERE, alive=alive_pids())
