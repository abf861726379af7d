"""The projection's fast paths against the reference helpers they inline or replace.

The hot path of `Projector.project_position` inlines `_request_rates`, `_track` /
`sqrt_controller`, `_clearly_viable`, `_brake_jerk` and the cached Cartesian certification;
the kinematics are compiled per chain; `_viable_jerk` finds its boundary by a safeguarded
regula falsi instead of bisection. These tests hold each to its reference: bit for bit where
the arithmetic is the same, and to the same viability and the bisection's precision where the
search differs. The envelope itself is checked from the outside by the fuzz tests.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pybullet_data
import pytest
import yaml

from sim2real_ros.paths import default_urdf, share_path
from sim2real_ros.robot import load_arm
from sim2real_ros.safety.envelope import derive_envelope_dict, load_envelope
from sim2real_ros.safety.kinematics import ToolKinematics
from sim2real_ros.safety.projection import (
    _BISECT_STEPS,
    _SNAP,
    Projector,
    _brake_jerk,
    _Joint,
    _viable_jerk,
    _violation_low,
    _violation_up,
)

ARM = load_arm(default_urdf())
HOME = [0.0, 0.0, 1.6, 0.0, 1.5, 0.0]
DT = 0.01
IIWA = Path(pybullet_data.getDataPath()) / "kuka_iiwa" / "model.urdf"


def _random_joint(rng: random.Random) -> _Joint:
    return _Joint("j", -2.0, 2.0, rng.uniform(0.5, 3.0), rng.uniform(2.0, 20.0),
                  rng.uniform(20.0, 500.0), 10.0, 2 * DT)


def _random_state(rng: random.Random, jt: _Joint) -> tuple[float, float, float]:
    return (rng.uniform(-2.0, 2.0), rng.uniform(-jt.vmax, jt.vmax),
            rng.uniform(-jt.amax, jt.amax))


@pytest.mark.parametrize("urdf", [default_urdf(), IIWA], ids=["sim2real_arm", "kuka_iiwa"])
def test_compiled_kinematics_equal_the_loop_bit_for_bit(urdf: Path) -> None:
    arm = load_arm(urdf)
    kin = ToolKinematics(arm)
    rng = np.random.default_rng(2)
    loop, fast = [0.0] * arm.n_joints, [0.0] * arm.n_joints
    for _ in range(500):
        q = list(rng.uniform(-4.0, 4.0, arm.n_joints))
        assert kin.fast_tool_position_and_levers(q, fast) == kin.tool_position_and_levers(q, loop)
        assert fast == loop


_ODD_AXES_URDF = """<?xml version="1.0"?>
<robot name="odd_axes">
  <link name="base"/><link name="l1"/><link name="l2"/><link name="l3"/><link name="l4"/>
  <link name="tip"/>
  <joint name="j1" type="revolute"><parent link="base"/><child link="l1"/>
    <origin xyz="0 0 0.1" rpy="0 0 0"/><axis xyz="0 0.6 0.8"/>
    <limit lower="-3" upper="3" effort="10" velocity="1"/></joint>
  <joint name="j2" type="revolute"><parent link="l1"/><child link="l2"/>
    <origin xyz="0.1 0.05 0.2" rpy="0.3 -0.2 0.1"/><axis xyz="1 0 0"/>
    <limit lower="-3" upper="3" effort="10" velocity="1"/></joint>
  <joint name="j3" type="prismatic"><parent link="l2"/><child link="l3"/>
    <origin xyz="0 0.1 0.3" rpy="0 0 0"/><axis xyz="0 0 1"/>
    <limit lower="-0.2" upper="0.4" effort="10" velocity="1"/></joint>
  <joint name="j4" type="revolute"><parent link="l3"/><child link="l4"/>
    <origin xyz="0.2 0 0" rpy="1.5707963267948966 0 0"/><axis xyz="0 -1 0"/>
    <limit lower="-3" upper="3" effort="10" velocity="1"/></joint>
  <joint name="fixed_tip" type="fixed"><parent link="l4"/><child link="tip"/>
    <origin xyz="0.05 0.02 0.15" rpy="0 0.4 0"/></joint>
</robot>
"""


def test_compiled_kinematics_cover_every_axis_kind(tmp_path: Path) -> None:
    """General, x and negative y axes, a prismatic joint, rotated and plain fixed transforms."""
    (tmp_path / "odd.urdf").write_text(_ODD_AXES_URDF)
    arm = load_arm(tmp_path / "odd.urdf")
    kin = ToolKinematics(arm)
    rng = np.random.default_rng(6)
    loop, fast = [0.0] * arm.n_joints, [0.0] * arm.n_joints
    for _ in range(300):
        q = list(rng.uniform(-0.2, 0.4, arm.n_joints))
        p = kin.fast_tool_position_and_levers(q, fast)
        assert p == kin.tool_position_and_levers(q, loop) and fast == loop
        assert np.allclose(p, arm.tool_position(np.array(q)), atol=1e-12)


def test_viable_jerk_search_ends_viable_and_as_close_as_bisection() -> None:
    """Where the boundary search runs, its result passes the exact test and lies within the
    bracket that _BISECT_STEPS bisection steps would leave around the boundary."""
    rng = random.Random(3)
    searched = 0
    for _ in range(20000):
        jt = _random_joint(rng)
        x, v, a = _random_state(rng, jt)
        jd = rng.uniform(-2.0 * jt.jmax, 2.0 * jt.jmax)
        j = _viable_jerk(jt, x, v, a, jd, DT)
        jlo = max(-jt.jmax, (-jt.amax - a) / DT)
        jhi = min(jt.jmax, (jt.amax - a) / DT)
        if jlo > jhi:
            continue
        start = min(max(jd, jlo), jhi)
        up0 = _violation_up(jt, x, v, a, start, DT)
        low0 = _violation_low(jt, x, v, a, start, DT)
        if up0 > 0.0 and _violation_up(jt, x, v, a, jlo, DT) <= 0.0:
            violation, good = _violation_up, jlo
        elif up0 <= 0.0 < low0 and _violation_low(jt, x, v, a, jhi, DT) <= 0.0:
            violation, good = _violation_low, jhi
        else:
            continue
        if _violation_up(jt, x, v, a, j, DT) > 0.0 or _violation_low(jt, x, v, a, j, DT) > 0.0:
            continue  # the other side binds too: the least-violation fallback, not the search
        searched += 1
        assert violation(jt, x, v, a, j, DT) <= 0.0
        # The boundary, by a bisection far finer than the projector's.
        g, b = good, start
        for _ in range(60):
            mid = 0.5 * (g + b)
            if violation(jt, x, v, a, mid, DT) <= 0.0:
                g = mid
            else:
                b = mid
        width = abs(start - good) * 0.5 ** _BISECT_STEPS
        assert abs(j - g) <= width + 1e-9 * jt.jmax
    assert searched > 300


def test_inlined_brake_equals_the_reference_helpers() -> None:
    proj = Projector(load_envelope(share_path("config", "safety_envelope.yaml"), ARM), ARM, DT)
    assert proj.reset(HOME)
    rng = random.Random(4)
    for _ in range(3000):
        x = [rng.uniform(jt.env_lo, jt.env_hi) for jt in proj.joints]
        proj.v = [rng.uniform(-jt.vmax, jt.vmax) * rng.choice((0.0, 1e-4, 1.0))
                  for jt in proj.joints]
        proj.a = [rng.uniform(-jt.amax, jt.amax) * rng.choice((0.0, 1e-3, 1.0))
                  for jt in proj.joints]
        expected = [_viable_jerk(jt, x[i], proj.v[i], proj.a[i],
                                 _brake_jerk(jt, proj.v[i], proj.a[i], DT), DT)
                    for i, jt in enumerate(proj.joints)]
        assert proj._brake_jerks(DT, x) == expected
        # With the bounds: those of the trial share 0 on the cached kinematics.
        proj._fk(x, proj._levers)
        proj._fk_q = list(x)
        out = [0.0] * proj.n
        bounds = proj._brake_into(DT, x, out, True)
        assert out == expected
        assert bounds == proj._trial_bounds(0.0, out, [1e9] * proj.n, DT, x)


def test_inlined_tracking_equals_the_reference_cascade(tmp_path: Path) -> None:
    """With the Cartesian limits out of reach, every command is the per-joint candidate: the
    inlined loop must give exactly what _request_rates, _track and _viable_jerk give."""
    data = derive_envelope_dict(ARM)
    data["workspace"]["box_min_m"] = [-100.0, -100.0, -100.0]
    data["workspace"]["box_max_m"] = [100.0, 100.0, 100.0]
    data["workspace"]["max_tool_speed_m_s"] = 1e6
    (tmp_path / "env.yaml").write_text(yaml.safe_dump(data))
    env = load_envelope(tmp_path / "env.yaml", ARM)
    proj = Projector(env, ARM, DT)
    ref = Projector(env, ARM, DT)  # only its state and reference helpers are used
    assert proj.reset(HOME) and ref.reset(HOME)
    rng = np.random.default_rng(5)
    lo = np.array([j.lower_rad for j in env.joints])
    hi = np.array([j.upper_rad for j in env.joints])
    target = np.array(HOME)
    t = 0.0
    for k in range(3000):
        if rng.random() < 0.03:
            target = np.clip(np.array(HOME) + rng.uniform(-2.0, 2.0, 6), lo - 0.5, hi + 0.5)
        wobble = 0.05 * np.sin(2.0 * np.pi * 0.7 * t + np.arange(6)) if k % 400 < 200 else 0.0
        req = list(target + wobble)
        t += DT
        # Reference: the per-joint candidate exactly as before the inlining.
        out = []
        for i, jt in enumerate(ref.joints):
            r, xi, vi, ai = req[i], ref.x[i], ref.v[i], ref.a[i]
            j = (r - xi - vi * DT - ai * DT * DT) / (DT * DT * DT)
            an = ai + j * DT
            vn = vi + an * DT
            if not (-jt.jmax <= j <= jt.jmax and -jt.amax <= an <= jt.amax
                    and -jt.vmax <= vn <= jt.vmax):
                vr, ar = ref._request_rates(i, jt, r, DT)
                j = ref._track(jt, r, vr, ar, xi, vi, ai, DT)
            elif not ref._synced[i]:
                vr, ar = ref._request_rates(i, jt, r, DT)
                if not (abs(vn - vr) <= 0.5 * jt.jmax * DT * DT
                        and abs(an - ar) <= 0.5 * jt.jmax * DT):
                    j = ref._track(jt, r, vr, ar, xi, vi, ai, DT)
            j = _viable_jerk(jt, xi, vi, ai, j, DT)
            xn = xi + (vi + (ai + j * DT) * DT) * DT
            if xn != r and abs(xn - r) <= _SNAP * (1.0 + abs(r)):
                xn = r
            out.append(xn)
            ref._r_prev2[i], ref._r_prev[i] = ref._r_prev[i], r
            ref._synced[i] = abs(xn - r) <= 1e-9 * (1.0 + abs(r))
            vnew = (xn - xi) / DT
            ref.a[i] = (vnew - vi) / DT
            ref.v[i] = vnew
            ref.x[i] = xn
        res = proj.project_position(None, req, DT)
        assert not res.braking
        assert res.command == out, k
