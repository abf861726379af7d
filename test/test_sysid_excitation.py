"""Excitation trajectories stay inside their envelope and start and stop smoothly."""

from __future__ import annotations

import numpy as np
import pytest

from sim2real_ros.paths import default_urdf
from sim2real_ros.robot.model import load_arm
from sim2real_ros.sysid.excitation import (
    KINDS,
    ExcitationEnvelope,
    ExcitationError,
    default_center,
    make_excitation,
)


@pytest.fixture(scope="module")
def env() -> ExcitationEnvelope:
    return ExcitationEnvelope.from_arm(load_arm(default_urdf()), 0.3, 0.3, 3.0)


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_stays_inside_the_envelope_and_starts_and_stops_at_rest(
    env: ExcitationEnvelope, kind: str
) -> None:
    c = default_center(env)
    exc = make_excitation(kind, c, env, duration_s=8.0, amplitude_rad=0.5, seed=3)
    env.check(exc)  # raises if outside
    assert np.all(exc.q >= env.lower_rad - 1e-9) and np.all(exc.q <= env.upper_rad + 1e-9)
    assert np.all(np.abs(exc.qd).max(axis=0) <= env.max_velocity_rad_s * 1.02)
    assert np.all(np.abs(exc.qdd).max(axis=0) <= env.max_acceleration_rad_s2 * 1.02)
    np.testing.assert_allclose(exc.q[0], c, atol=1e-9)
    np.testing.assert_allclose(exc.q[-1], c, atol=1e-6)
    assert np.abs(exc.qd[[0, -1]]).max() < 1e-3
    # every joint actually moves
    assert np.all(np.ptp(exc.q, axis=0) > 0.02)


def test_multisine_joints_are_decorrelated(env: ExcitationEnvelope) -> None:
    exc = make_excitation("multisine", default_center(env), env, 20.0, 0.3)
    corr = np.corrcoef(exc.qd.T)
    off = np.abs(corr[~np.eye(corr.shape[0], dtype=bool)])
    assert off.max() < 0.5


def test_centre_outside_the_envelope_is_refused(env: ExcitationEnvelope) -> None:
    c = default_center(env)
    c[1] = env.upper_rad[1] + 0.05
    with pytest.raises(ExcitationError, match="shoulder_lift_joint: centre"):
        make_excitation("chirp", c, env, 5.0, 0.3)


def test_sampling_holds_the_ends_and_interpolates(env: ExcitationEnvelope) -> None:
    exc = make_excitation("step", default_center(env), env, 6.0, 0.3, seed=1)
    np.testing.assert_allclose(exc.at(-1.0), exc.q[0])
    np.testing.assert_allclose(exc.at(99.0), exc.q[-1])
    mid = exc.at(2.0005)
    assert np.all(np.minimum(exc.q[2000], exc.q[2001]) - 1e-12 <= mid)


def test_bad_arguments_name_the_problem(env: ExcitationEnvelope) -> None:
    with pytest.raises(ExcitationError, match="kind"):
        make_excitation("sawtooth", default_center(env), env)
    with pytest.raises(ExcitationError, match="duration_s"):
        make_excitation("multisine", default_center(env), env, duration_s=0.1)
    with pytest.raises(ExcitationError, match="f_min_hz"):
        make_excitation("chirp", default_center(env), env, 5.0, 0.3, f_min_hz=3.0, f_max_hz=1.0)
