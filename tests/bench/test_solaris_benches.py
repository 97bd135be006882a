"""The solaris benches' steady rate: pairs/s inside a run, from its /metrics samples."""

import pytest

from bench.solaris_efficiency import steady_pairs_rate


def test_the_steady_rate_leaves_the_start_up_and_the_idle_exit_out() -> None:
    # 10 s of start-up with nothing computed, 1,000 pairs/s for 10 s, then 5 s of idle exit: the whole
    # run's rate (400 pairs/s) understates it.
    samples = [(float(t), 0.0) for t in range(11)]
    samples += [(10.0 + t, 1_000.0 * t) for t in range(1, 11)]
    samples += [(20.0 + t, 10_000.0) for t in range(1, 6)]
    assert steady_pairs_rate(samples, 10_000) == pytest.approx(1_000.0)


def test_the_steady_rate_interpolates_between_samples() -> None:
    # Crossings at 1,000 and 9,000 pairs fall between samples taken 2 s apart: 8,000 pairs in 8 s.
    samples = [(0.0, 0.0), (2.0, 2_000.0), (4.0, 4_000.0), (6.0, 6_000.0), (8.0, 8_000.0), (10.0, 10_000.0)]
    assert steady_pairs_rate(samples, 10_000) == pytest.approx(1_000.0)


@pytest.mark.parametrize(
    "samples",
    [
        [],
        [(0.0, 0.0), (1.0, 10_000.0)],  # the whole window between two samples
        [(0.0, 0.0), (1.0, 2_000.0), (2.0, 5_000.0), (3.0, 8_000.0)],  # never reached 90%
    ],
)
def test_the_steady_rate_is_refused_without_samples_across_its_window(samples: list[tuple[float, float]]) -> None:
    with pytest.raises(SystemExit, match="too few /metrics samples"):
        steady_pairs_rate(samples, 10_000)
