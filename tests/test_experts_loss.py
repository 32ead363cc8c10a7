"""Loss functions of experts.loss: the paper's walltime loss and the 50%-slowdown degradation loss."""

from __future__ import annotations

import math

import pytest

from cosched.errors import ConfigError
from experts.loss import degradation_loss, walltime_loss


def test_walltime_loss_paper_example() -> None:
    assert walltime_loss(140, 100) == pytest.approx(0.4)  # section 3.2: min(1, |140 - 100| / 100)
    assert walltime_loss(70, 100) == 0.0  # within the walltime: no loss
    assert walltime_loss(100, 100) == 0.0
    assert walltime_loss(250, 100) == 1.0  # capped


def test_degradation_loss_is_one_at_fifty_percent_slowdown() -> None:
    assert degradation_loss(150, 100) == pytest.approx(1.0)
    assert degradation_loss(110, 100) == pytest.approx(0.2)
    assert degradation_loss(90, 100) == 0.0  # faster than baseline is no reward
    assert degradation_loss(400, 100) == 1.0
    assert degradation_loss(120, 100, full_at=1.0) == pytest.approx(0.2)


@pytest.mark.parametrize(
    "call",
    [
        lambda: walltime_loss(10, 0),
        lambda: walltime_loss(-1, 10),
        lambda: walltime_loss(math.nan, 10),
        lambda: degradation_loss(10, 0),
        lambda: degradation_loss(10, -5),
        lambda: degradation_loss(10, 10, full_at=0),
        lambda: degradation_loss(math.inf, 10),
    ],
)
def test_loss_input_validation(call) -> None:
    with pytest.raises(ConfigError):
        call()
