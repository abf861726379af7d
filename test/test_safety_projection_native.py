"""The C core of `Projector.project_position` against the Python reference, bit for bit.

Two projectors on the same envelope, one forced onto the Python path and one on the C core, are
fed the same streams: random far targets, huge finite values, targets at and just past the
limits, bang-bang reversals, smooth tracking, a workspace box the tool keeps running into,
injected states at the rate limits, scale changes mid-stream (which leave |a| above the new
limit) and interleaved velocity, brake and reset calls (Python on both, on the shared state).
Every result (command, flags, deviation, events with their limits, joints and amounts) and the
whole command state must be the same floats. Another test makes sure this venv really runs the
C core, so CI notices a build that silently fell back to Python.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pybullet_data
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim2real_ros.paths import default_urdf, share_path
from sim2real_ros.robot import load_arm
from sim2real_ros.robot.model import ArmModel
from sim2real_ros.safety import projection
from sim2real_ros.safety.envelope import Envelope, derive_envelope_dict, load_envelope
from sim2real_ros.safety.projection import Projection, Projector
from test_safety_projection_fast import _ODD_AXES_URDF  # every axis kind, a prismatic joint

ARM6 = load_arm(default_urdf())
IIWA = load_arm(Path(pybullet_data.getDataPath()) / "kuka_iiwa" / "model.urdf")
HOME6 = [0.0, 0.0, 1.6, 0.0, 1.5, 0.0]
HOME7 = [0.0, 0.6, 0.0, -1.2, 0.0, 0.8, 0.0]
HOME_ODD = [0.2, -0.3, 0.1, 0.4]
DT = 0.01
STREAM = 1000  # commands per (arm, envelope, attack) stream
# Commands compared per test, asserted at the end so the suite keeps its promise.
COUNTS: dict[str, int] = {}

native = pytest.mark.skipif(not projection.NATIVE_AVAILABLE,
                            reason="C core not built (test_c_core_is_built_and_used fails)")


def _envelope(arm: ArmModel, home: list[float], kind: str, tmp: Path) -> Envelope:
    """The shipped (6-joint) or URDF-derived envelope, or one with a small box round home."""
    if kind == "shipped" and arm is ARM6:
        return load_envelope(share_path("config", "safety_envelope.yaml"), arm)
    data = derive_envelope_dict(arm)
    if kind == "tight":
        tool = arm.tool_position(np.array(home))
        data["workspace"]["box_min_m"] = [round(float(t) - 0.12, 3) for t in tool]
        data["workspace"]["box_max_m"] = [round(float(t) + 0.12, 3) for t in tool]
        data["workspace"]["max_tool_speed_m_s"] = 0.25
    path = tmp / f"{arm.name}_{kind}.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_envelope(path, arm)


def _bits(v: Any) -> Any:
    """A float as its exact hex (NaN-safe equality); containers recursively."""
    if isinstance(v, float):
        return v.hex()
    if isinstance(v, (list, tuple)):
        return [_bits(u) for u in v]
    return v


def _result(p: Projection) -> Any:
    events = [(e.kind, e.limit, e.joint, _bits(e.excess), e.detail) for e in p.events]
    return (_bits(p.command), p.mode, _bits(p.dt_s), p.accepted, p.intervened, p.braking,
            _bits(p.deviation), events)


def _state(p: Projector) -> Any:
    return _bits([p.x, p.v, p.a, p._r_prev, p._r_prev2, p._synced, p._fk_q, p._levers,
                  p._fk_dist, p._last_speed, p._last_tail, p.initialized])


class Pair:
    """The same envelope on the Python reference and on the C core, stepped together."""

    def __init__(self, env: Envelope, arm: ArmModel, home: list[float], scale: float = 1.0
                 ) -> None:
        self.ref = Projector(env, arm, DT, scale=scale, native=False)
        self.fast = Projector(env, arm, DT, scale=scale, native=True)
        assert self.ref.backend == "python" and self.fast.backend == "native"
        assert self.ref.reset(home) and self.fast.reset(home)
        self.calls = 0

    def position(self, values: list[Any], dt: float = DT, names: list[str] | None = None
                 ) -> Projection:
        a = self.ref.project_position(names, values, dt)
        b = self.fast.project_position(names, values, dt)
        self.calls += 1
        assert _result(b) == _result(a), (self.calls, values)
        assert _state(self.fast) == _state(self.ref), (self.calls, values)
        return a

    def both(self, method: str, *args: Any) -> None:
        a = getattr(self.ref, method)(*args)
        b = getattr(self.fast, method)(*args)
        if isinstance(a, Projection):
            assert _result(a) == _result(b)
        else:
            assert a == b
        assert _state(self.fast) == _state(self.ref)

    def inject(self, x: list[float], v: list[float], a: list[float]) -> None:
        """Put both projectors in the same (possibly extreme) command state."""
        for p in (self.ref, self.fast):
            p.x, p.v, p.a = list(x), list(v), list(a)


def _limits(env: Envelope) -> tuple[np.ndarray, np.ndarray]:
    return (np.array([j.lower_rad for j in env.joints]),
            np.array([j.upper_rad for j in env.joints]))


ATTACKS = ["far", "huge", "limits", "reversal", "tracking", "box_edge", "states", "mixed"]


def _run_stream(pair: Pair, env: Envelope, home: list[float], attack: str,
                rng: np.random.Generator) -> None:
    lo, hi = _limits(env)
    n = lo.size
    h = np.array(home)
    target = h.copy()
    joints = pair.ref.joints
    for k in range(STREAM):
        x = np.array(pair.ref.x)
        dt = DT if rng.random() < 0.7 else float(rng.uniform(0.5 * DT, 2.0 * DT))
        if attack == "far":
            if rng.random() < 0.03:
                target = np.clip(h + rng.uniform(-2.0, 2.0, n), lo - 0.5, hi + 0.5)
            cmd = target
        elif attack == "huge":
            cmd = x + rng.normal(0.0, 0.02, n)
            m = rng.random(n) < 0.3
            cmd[m] = rng.choice([1e300, -1e300, 1e12, -1e12, 1e6, 5e-324, -0.0, 1.7e308], m.sum())
        elif attack == "limits":
            if rng.random() < 0.05:
                side = rng.choice([-1.0, 1.0], n)
                eps = rng.choice([0.0, 1e-15, 1e-9, 1e-6, 1e-3, 0.2], n)
                target = np.where(side > 0, hi + side * eps * rng.choice([-1, 1], n),
                                  lo - eps * rng.choice([-1, 1], n))
            cmd = target
        elif attack == "reversal":
            period = 1 + k // 200
            sign = 1.0 if (k // period) % 2 == 0 else -1.0
            cmd = np.clip(x + sign * rng.uniform(0.0, 0.4, n), lo - 0.1, hi + 0.1)
        elif attack == "tracking":
            wobble = 0.05 * np.sin(2.0 * np.pi * 0.5 * k * DT + np.arange(n))
            cmd = h + wobble + (rng.normal(0.0, 1e-4, n) if k % 300 > 200 else 0.0)
            dt = DT
        elif attack == "box_edge":
            if rng.random() < 0.05:
                target = h + rng.uniform(-0.6, 0.6, n)
            cmd = target + (rng.normal(0.0, 1e-3, n) if rng.random() < 0.5 else 0.0)
        elif attack == "states":
            if rng.random() < 0.1:
                # A state at or near the rate limits, moving towards or away from a limit.
                xs = [float(rng.choice([jt.lo, jt.hi, jt.env_lo, jt.env_hi,
                                        rng.uniform(jt.lo, jt.hi)])) for jt in joints]
                vs = [float(rng.choice([-1.0, 1.0, 0.0, rng.uniform(-1, 1)]) * jt.vmax)
                      for jt in joints]
                as_ = [float(rng.choice([-1.0, 1.0, 0.0, 1e-3, rng.uniform(-1, 1)]) * jt.amax)
                       for jt in joints]
                pair.inject(xs, vs, as_)
            cmd = np.array(pair.ref.x) + rng.normal(0.0, 0.05, n) * rng.choice([0.0, 1.0, 20.0])
        else:  # "mixed": interleave the Python-only calls and scale changes
            u = rng.random()
            if u < 0.05:
                pair.both("brake", dt)
                continue
            if u < 0.1:
                vel = list(rng.uniform(-2.0, 2.0, n))
                pair.both("project_velocity", None, vel, dt, list(pair.ref.x))
                continue
            if u < 0.12:
                pair.both("set_scale", float(rng.choice([1.0, 0.5, 0.2])))
            elif u < 0.13:
                pair.both("reset", list(h + rng.uniform(-0.3, 0.3, n)))
            elif u < 0.16:
                bad = list(x)
                bad[int(rng.integers(n))] = float(rng.choice([math.nan, math.inf]))
                pair.position(bad, dt)
                continue
            if rng.random() < 0.04:
                target = h + rng.uniform(-1.5, 1.5, n)
            cmd = target
        pair.position([float(c) for c in cmd], dt)


def _arm(name: str, tmp: Path) -> tuple[ArmModel, list[float]]:
    if name == "sim2real_arm":
        return ARM6, HOME6
    if name == "kuka_iiwa":
        return IIWA, HOME7
    (tmp / "odd.urdf").write_text(_ODD_AXES_URDF)
    return load_arm(tmp / "odd.urdf"), HOME_ODD


ARMS = ["sim2real_arm", "kuka_iiwa", "odd_axes"]


@native
@pytest.mark.parametrize("attack", ATTACKS)
@pytest.mark.parametrize("arm_name", ARMS)
def test_c_core_equals_the_python_reference_bit_for_bit(arm_name: str, attack: str,
                                                        tmp_path: Path) -> None:
    arm, home = _arm(arm_name, tmp_path)
    rng = np.random.default_rng([ATTACKS.index(attack), ARMS.index(arm_name)])
    kinds = ["tight"] if attack == "box_edge" else ["shipped", "tight"]
    for kind in kinds:
        env = _envelope(arm, home, kind, tmp_path)
        for scale in (1.0, env.limited_scale):
            pair = Pair(env, arm, home, scale)
            _run_stream(pair, env, home, attack, rng)
            COUNTS["compared"] = COUNTS.get("compared", 0) + pair.calls


@st.composite
def _hyp_streams(draw: Any) -> dict[str, Any]:
    """An arm, a scale, an optional injected state and a short stream of arbitrary commands."""
    arm_name = draw(st.sampled_from(["sim2real_arm", "kuka_iiwa"]))
    n = 6 if arm_name == "sim2real_arm" else 7
    value = st.one_of(st.floats(-4.0, 4.0), st.floats(allow_nan=False, allow_infinity=False),
                      st.sampled_from([0.0, -0.0, 5e-324, 1e-300, 2.9, -2.9, 3.1, -3.1]))
    unit = st.one_of(st.sampled_from([-1.0, 0.0, 1.0, 1.0 - 1e-12, -1.0 + 1e-12]),
                     st.floats(-1.0, 1.0))
    return {
        "arm": arm_name,
        "tight": draw(st.booleans()),
        "scale": draw(st.sampled_from([1.0, 0.5])),
        "state": draw(st.none() | st.tuples(*[st.tuples(unit, unit, unit)] * n)),
        "commands": draw(st.lists(st.tuples(st.lists(value, min_size=n, max_size=n),
                                            st.floats(0.5 * DT, 2.0 * DT)),
                                  min_size=1, max_size=60)),
    }


@native
@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(_hyp_streams())
def test_c_core_equals_the_python_reference_on_arbitrary_floats(tmp_path: Path,
                                                                sc: dict[str, Any]) -> None:
    """Any finite command (subnormals to 1.8e308) from any state on or inside the limits."""
    arm, home = _arm(sc["arm"], tmp_path)
    env = _envelope(arm, home, "tight" if sc["tight"] else "shipped", tmp_path)
    pair = Pair(env, arm, home, sc["scale"])
    if sc["state"] is not None:
        joints = pair.ref.joints
        pair.inject([jt.lo + 0.5 * (u + 1.0) * (jt.hi - jt.lo) for jt, (u, _, _) in
                     zip(joints, sc["state"])],
                    [u * jt.vmax for jt, (_, u, _) in zip(joints, sc["state"])],
                    [u * jt.amax for jt, (_, _, u) in zip(joints, sc["state"])])
    for values, dt in sc["commands"]:
        pair.position(values, dt)
    COUNTS["compared"] = COUNTS.get("compared", 0) + pair.calls


@native
def test_cartesian_events_and_braking_are_exercised_and_equal(tmp_path: Path) -> None:
    """The tight box must really brake (else the Cartesian half of the core is untested)."""
    env = _envelope(ARM6, HOME6, "tight", tmp_path)
    pair = Pair(env, ARM6, HOME6)
    limits: set[str] = set()
    rng = np.random.default_rng(7)
    for k in range(1500):
        if k % 50 == 0:
            target = np.array(HOME6) + rng.uniform(-1.0, 1.0, 6)
        res = pair.position(list(target))
        limits.update(e.limit for e in res.events)
    COUNTS["compared"] = COUNTS.get("compared", 0) + pair.calls
    assert {"workspace", "tool_speed"} <= limits
    assert limits & {"velocity", "acceleration", "jerk", "position"}


@native
def test_reordered_names_and_invalid_inputs_take_the_same_path() -> None:
    env = load_envelope(share_path("config", "safety_envelope.yaml"), ARM6)
    pair = Pair(env, ARM6, HOME6)
    names = list(reversed(ARM6.joint_names))
    for k in range(200):
        values = [HOME6[5 - i] + 0.3 * math.sin(0.05 * k + i) for i in range(6)]
        pair.position(values, DT, names)
    for bad in ([0.0] * 5, [math.nan] * 6, ["x"] * 6):
        pair.position(bad)
    for dt in (0.0, -1.0, math.nan, 1.0):
        pair.position(list(HOME6), dt)
    COUNTS["compared"] = COUNTS.get("compared", 0) + pair.calls


def test_equivalence_compared_enough_commands() -> None:
    assert projection.NATIVE_AVAILABLE, "sim2real_ros.safety._projection did not import"
    assert COUNTS.get("compared", 0) >= 20_000, COUNTS


def test_c_core_is_built_and_used() -> None:
    """This venv must run the C core: a build that silently fell back to Python fails here."""
    assert projection.NATIVE_AVAILABLE, "sim2real_ros.safety._projection did not import"
    assert projection._native is not None
    assert Path(projection._native.__file__).suffix == ".so"
    forced = os.environ.get(projection.FORCE_PYTHON_ENV, "") not in ("", "0")
    assert projection.BACKEND == ("python" if forced else "native")
    if forced:  # the run asked for the Python path: the default Projector must honour it
        env = load_envelope(share_path("config", "safety_envelope.yaml"), ARM6)
        assert Projector(env, ARM6, DT).backend == "python"
        return
    env = load_envelope(share_path("config", "safety_envelope.yaml"), ARM6)
    proj = Projector(env, ARM6, DT)
    assert proj.backend == "native"
    assert Projector(env, ARM6, DT, native=False).backend == "python"

    class Spy:
        def __init__(self, core: Any) -> None:
            self.core, self.calls = core, 0

        def project_position(self, *args: Any) -> Any:
            self.calls += 1
            return self.core.project_position(*args)

    spy = Spy(proj._core)
    proj._core = spy
    assert proj.reset(HOME6)
    for k in range(10):
        proj.project_position(None, [h + 0.01 * k for h in HOME6], DT)
    assert spy.calls == 10
    proj.set_scale(0.5)  # a new core for the new limits
    assert proj.backend == "native" and proj._core is not spy


@native
def test_c_core_constants_are_the_python_ones() -> None:
    for name, value in projection._native.CONSTANTS.items():
        assert getattr(projection, name) == value, name


def test_environment_variable_forces_the_python_path() -> None:
    code = ("from sim2real_ros.safety import projection as p; "
            "print(p.BACKEND, p.NATIVE_AVAILABLE)")
    env = dict(os.environ, **{projection.FORCE_PYTHON_ENV: "1"})
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True).stdout.split()
    assert out[0] == "python"


def test_native_true_without_the_extension_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(projection, "NATIVE_AVAILABLE", False)
    env = load_envelope(share_path("config", "safety_envelope.yaml"), ARM6)
    with pytest.raises(RuntimeError, match="not built"):
        Projector(env, ARM6, DT, native=True)


@native
def test_a_state_the_core_cannot_read_falls_back_to_the_python_path() -> None:
    env = load_envelope(share_path("config", "safety_envelope.yaml"), ARM6)
    pair = Pair(env, ARM6, HOME6)
    for p in (pair.ref, pair.fast):
        p.x = np.array(p.x)  # not a list: the core refuses it and nothing is changed
    a = pair.ref.project_position(None, [h + 0.001 for h in HOME6], DT)
    b = pair.fast.project_position(None, [h + 0.001 for h in HOME6], DT)
    assert _result(a) == _result(b)
    assert pair.fast.x.tolist() == pair.ref.x.tolist()
