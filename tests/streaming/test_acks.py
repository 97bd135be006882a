"""The offset commits that Flink's checkpoints finalize: in order, and never lost for good."""

from __future__ import annotations

import threading
import time

from pipelines.streaming.acks import _PartitionCommits


def test_a_later_offset_committed_first_is_never_overwritten_by_an_older_one() -> None:
    commits, sent = _PartitionCommits(), []

    def send(offset: int) -> bool:
        sent.append(offset)
        return True

    assert commits.should_register(100, now=0.0, stale_s=5.0)
    assert commits.should_register(200, now=0.1, stale_s=5.0)  # another instance, a later bundle
    commits.commit(200, lambda: send(200))  # its finalization runs first ...
    commits.commit(100, lambda: send(100))  # ... and the older one finds it done
    assert sent == [200] and commits.committed == 200


def test_a_registration_without_a_commit_is_registered_again_once_stale() -> None:
    commits = _PartitionCommits()
    assert commits.should_register(300, now=0.0, stale_s=5.0)
    assert not commits.should_register(300, now=4.9, stale_s=5.0)  # its callback may still come
    assert commits.should_register(300, now=5.1, stale_s=5.0)  # it did not: the tick registers again
    commits.commit(300, lambda: True)
    assert not commits.should_register(300, now=60.0, stale_s=5.0)  # committed: nothing to do


def test_a_failed_send_lets_the_next_acknowledgement_register_again() -> None:
    commits = _PartitionCommits()
    assert commits.should_register(50, now=0.0, stale_s=5.0)
    commits.commit(50, lambda: False)  # broker away
    assert commits.committed == -1
    assert commits.should_register(50, now=0.5, stale_s=5.0)


def test_concurrent_callbacks_send_one_at_a_time_and_end_at_the_highest_offset() -> None:
    commits, sent, inside, overlaps = _PartitionCommits(), [], [], []

    def send(offset: int) -> bool:  # (an assert here would only print, in its thread)
        inside.append(offset)
        if len(inside) > 1:
            overlaps.append(tuple(inside))
        time.sleep(0.001)
        sent.append(offset)
        inside.pop()
        return True

    threads = [threading.Thread(target=commits.commit, args=(o, lambda o=o: send(o))) for o in range(1, 41)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not overlaps, f"sends at once: {overlaps[:3]}"
    assert commits.committed == 40
    assert sent == sorted(sent)  # each send is newer than the last
