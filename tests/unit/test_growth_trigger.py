"""The slope trigger: the smoothed log-log slope of loss against compute, and when it fires."""

import math

import pytest

from growth.errors import GrowthError
from growth.trigger import first_trigger_index, loglog_slope, slope_trigger


def test_slope_of_a_power_law_and_trigger():
    compute = [1e15 * 1.5**i for i in range(30)]
    losses = [10 * c**-0.05 for c in compute]
    assert loglog_slope(compute, losses, window=10, beta=0.0) == pytest.approx(-0.05, abs=1e-9)
    assert slope_trigger(compute, losses, threshold=-0.0575, beta=0.0)  # flatter than depth's threshold: grow
    assert not slope_trigger(compute, losses, threshold=-0.03, beta=0.0)
    assert not slope_trigger(compute[:3], losses[:3], threshold=-0.0575)
    with pytest.raises(GrowthError, match="at least"):
        loglog_slope(compute[:3], losses[:3])
    assert math.isfinite(loglog_slope(compute, losses))


def test_first_trigger_index_is_the_first_evaluation_at_which_the_trigger_fires():
    compute = [1e15 * 1.5**i for i in range(30)]
    losses = [10 * c**-0.05 for c in compute]
    assert first_trigger_index(compute, losses, -0.0575, window=10, beta=0.0) == 9  # as soon as 10 points exist
    assert first_trigger_index(compute, losses, -0.03, window=10, beta=0.0) is None  # never that flat
