"""The runners bench's steady-state rate: the fixed cost of a job cancels out."""

import pytest

from bench.runners import Sized, steady_rate


def test_steady_rate_is_the_added_events_over_the_added_seconds() -> None:
    # 10 s of fixed cost, then 100k events/s: the whole-run rates (50k, 66.7k) understate it.
    assert steady_rate((1_000_000, 20.0), (2_000_000, 30.0)) == pytest.approx(100_000)
    assert Sized(small=(100_000, 11.0), big=(2_000_000, 30.0)).steady == pytest.approx(100_000)


def test_steady_rate_refuses_a_bigger_input_that_was_not_slower() -> None:
    with pytest.raises(ValueError, match="bigger input must take longer"):
        steady_rate((100_000, 12.0), (2_000_000, 11.5))
    with pytest.raises(ValueError, match="bigger input must take longer"):
        steady_rate((100_000, 12.0), (100_000, 13.0))
