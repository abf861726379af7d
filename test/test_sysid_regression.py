"""The effort regression's helpers without a plant: alignment, options and their errors."""

from __future__ import annotations

import argparse
import math

import numpy as np
import pytest

from sim2real_ros.sysid.cli import _lag_arg
from sim2real_ros.sysid.fit import FitError, FitOptions
from sim2real_ros.sysid.regression import align_effort
from sim2real_ros.sysid.runs import RunData


def _run(tau: np.ndarray | None) -> RunData:
    t = np.arange(200) * 0.008
    return RunData(name="r", joint_names=["a", "b"], t_s=t, q=np.zeros((200, 2)),
                   qd=np.zeros((200, 2)), tau=tau, cmd_t_s=np.array([0.0, 1.0]),
                   cmd=np.zeros((2, 2)))


def test_align_effort_reads_each_effort_lag_seconds_after_its_stamp() -> None:
    t = np.arange(200) * 0.008
    run = _run(np.column_stack([3.0 * t, -t + 1.0]))
    out = align_effort([run], 0.004)[0]
    assert out.tau is not None and run.tau is not None
    # Linear efforts: the shifted value is exact up to the run's end, which holds the last.
    assert np.allclose(out.tau[:-1, 0], 3.0 * (t[:-1] + 0.004))
    assert np.allclose(out.tau[:-1, 1], -(t[:-1] + 0.004) + 1.0)
    assert out.tau[-1, 0] == run.tau[-1, 0]
    assert np.array_equal(out.q, run.q) and np.array_equal(out.t_s, run.t_s)
    # The input is left alone; a zero lag and a run without efforts pass through.
    assert np.allclose(run.tau[:, 0], 3.0 * t)
    assert align_effort([run], 0.0)[0] is run
    bare = _run(None)
    assert align_effort([bare], 0.004)[0].tau is None


@pytest.mark.parametrize("lag", [-0.001, math.nan, math.inf])
def test_align_effort_refuses_a_negative_or_non_finite_lag(lag: float) -> None:
    with pytest.raises(ValueError, match="effort lag"):
        align_effort([_run(np.zeros((200, 2)))], lag)


@pytest.mark.parametrize("lag", [-0.001, 0.2, math.nan])
def test_fit_options_refuse_an_effort_lag_outside_its_range(lag: float) -> None:
    with pytest.raises(FitError, match="effort_lag_s"):
        FitOptions(effort_lag_s=lag).check()
    FitOptions(effort_lag_s=None).check()
    FitOptions(effort_lag_s=0.004).check()


def test_cli_effort_lag_takes_seconds_or_auto() -> None:
    assert _lag_arg("auto") is None and _lag_arg(" AUTO ") is None
    assert _lag_arg("0.004") == pytest.approx(0.004)
    for bad in ("-1", "0.5", "soon"):
        with pytest.raises(argparse.ArgumentTypeError, match="--effort-lag-s"):
            _lag_arg(bad)
