"""``Retention``: which steps a directory keeps, as a pure function of steps and metrics."""

from __future__ import annotations

import pytest

from dew.checkpointing.step_files import Retention


def test_newest_keeps_every_step_while_there_are_fewer_than_it():
    assert Retention(newest=5).keep({1: None, 2: None, 3: None}) == {1, 2, 3}
    assert Retention(newest=2).keep({1: None, 2: None, 3: None}) == {2, 3}


def test_best_adds_the_lowest_metric_steps_and_ignores_steps_without_the_metric():
    metrics = {1: {"loss": 0.2}, 2: None, 3: {"fid": 1.0}, 4: {"loss": 0.9}, 5: {"loss": float("nan")}, 6: {}}
    assert Retention(newest=1, best=2).keep(metrics) == {1, 4, 6}
    assert Retention(newest=1, best=1, metric="fid").keep(metrics) == {3, 6}
    assert Retention(newest=1, best=1).best_step(metrics) == 1


def test_ties_rank_the_earlier_step_first_and_none_keeps_all():
    metrics = {1: {"loss": 9.0}, 2: {"loss": 9.0}, 3: {"loss": 9.0}}
    assert Retention(newest=0, best=1).keep(metrics) == {1}
    assert Retention(newest=None).keep(metrics) == {1, 2, 3}


@pytest.mark.parametrize(
    "bad", [{"newest": -1}, {"newest": 1, "best": -1}, {"newest": True}, {"newest": 1, "metric": ""}]
)
def test_bad_arguments_are_named(bad):
    with pytest.raises(ValueError, match="Retention: "):
        Retention(**bad)
