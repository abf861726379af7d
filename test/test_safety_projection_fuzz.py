"""Property/fuzz tests: no emitted command ever leaves the envelope, and nothing ever raises.

Every hypothesis example draws a scenario (seed, attack style, dt style, name style, special
values, envelope) and then feeds a batch of several hundred commands generated from the seed, so
the whole suite pushes well over 100,000 commands through the core within the time budget. The
emitted commands are checked from the outside: finite differences with the dt the projector
reports, forward kinematics from the arm model (not the projector's own kinematics).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim2real_ros.paths import default_urdf, share_path
from sim2real_ros.robot import load_arm
from sim2real_ros.safety.envelope import Envelope, derive_envelope_dict, load_envelope
from sim2real_ros.safety.projection import Projector
from sim2real_ros.safety.supervisor import Supervisor, SupervisorConfig

ARM = load_arm(default_urdf())
ENV = load_envelope(share_path("config", "safety_envelope.yaml"), ARM)
HOME = np.array([0.0, 0.0, 1.6, 0.0, 1.5, 0.0])
PERIOD = 0.01
NAMES = list(ARM.joint_names)
SPECIALS = [math.nan, math.inf, -math.inf, 1e300, -1e300, 1e9, -1e9, 0.0, 5e-324, -0.0]
# Commands pushed through the core per test, asserted so the suite keeps its promise.
COUNTS: dict[str, int] = {}

FUZZ = settings(max_examples=110, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def tight_envelope(tmp_path_factory: pytest.TempPathFactory) -> Envelope:
    """A small workspace box around the home pose, so the Cartesian logic is exercised."""
    data = derive_envelope_dict(ARM)
    tool = ARM.tool_position(HOME)
    data["workspace"]["box_min_m"] = [round(float(t) - 0.15, 3) for t in tool]
    data["workspace"]["box_max_m"] = [round(float(t) + 0.15, 3) for t in tool]
    data["workspace"]["max_tool_speed_m_s"] = 0.3
    path = tmp_path_factory.mktemp("env") / "tight.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_envelope(path, ARM)


def tool_positions(q: np.ndarray) -> np.ndarray:
    """Tool positions of many configurations at once, from the URDF chain (N x n -> N x 3)."""
    q = np.atleast_2d(q)
    t = np.tile(np.eye(4), (q.shape[0], 1, 1))
    k = 0
    for j in ARM.chain:
        t = t @ j.origin
        if j.joint_type in ("revolute", "continuous"):
            x, y, z = j.axis
            c, s_ = np.cos(q[:, k]), np.sin(q[:, k])
            v = 1.0 - c
            r = np.zeros_like(t)
            # Rodrigues' formula, one matrix per configuration.
            r[:, 0, 0] = c + x * x * v
            r[:, 0, 1] = x * y * v - z * s_
            r[:, 0, 2] = x * z * v + y * s_
            r[:, 1, 0] = y * x * v + z * s_
            r[:, 1, 1] = c + y * y * v
            r[:, 1, 2] = y * z * v - x * s_
            r[:, 2, 0] = z * x * v - y * s_
            r[:, 2, 1] = z * y * v + x * s_
            r[:, 2, 2] = c + z * z * v
            r[:, 3, 3] = 1.0
            t = t @ r
            k += 1
    return t[:, :3, 3]


@dataclass
class Checker:
    """Collects emitted commands; `verify` recomputes every limit independently of the core."""

    env: Envelope
    scale: float
    x0: np.ndarray
    v0: np.ndarray
    a0: np.ndarray
    cmds: list[list[float]] = field(default_factory=list)
    dts: list[float] = field(default_factory=list)
    scales: list[float] = field(default_factory=list)

    @classmethod
    def start(cls, env: Envelope, scale: float, x0: Any, v0: Any = None, a0: Any = None
              ) -> Checker:
        x = np.asarray(x0, dtype=float)
        z = np.zeros_like(x)
        return cls(env, scale, x, z if v0 is None else np.asarray(v0, dtype=float),
                   z if a0 is None else np.asarray(a0, dtype=float))

    @property
    def n(self) -> int:
        return len(self.cmds)

    def add(self, command: list[float], dt: float) -> None:
        self.cmds.append(command)
        self.dts.append(dt)
        self.scales.append(self.scale)

    def verify(self) -> list[str]:
        """Return a description of every violated limit (empty when all commands are inside)."""
        if not self.cmds:
            return []
        bad: list[str] = []
        lens = {len(c) for c in self.cmds}
        if lens != {self.x0.size}:
            return [f"malformed command lengths {lens}"]
        c = np.array(self.cmds, dtype=float)
        if not np.all(np.isfinite(c)):
            return ["non-finite command"]
        dt = np.array(self.dts)[:, None]
        sc = np.array(self.scales)[:, None]
        x = np.vstack([self.x0, c])
        v = np.vstack([self.v0, np.diff(x, axis=0) / dt])
        a = np.vstack([self.a0, np.diff(v, axis=0) / dt])
        j = np.diff(a, axis=0) / dt
        v, a = v[1:], a[1:]
        env = self.env
        lo = np.array([je.lower_rad for je in env.joints])
        hi = np.array([je.upper_rad for je in env.joints])
        vmax = np.array([je.velocity_rad_s for je in env.joints]) * sc
        amax = np.array([je.acceleration_rad_s2 for je in env.joints]) * sc
        jmax = np.array([je.jerk_rad_s3 for je in env.joints]) * sc
        checks = [
            ("position", (c < lo - 1e-12) | (c > hi + 1e-12)),
            ("velocity", np.abs(v) > vmax * (1 + 1e-9) + 1e-9),
            ("acceleration", np.abs(a) > amax * (1 + 1e-7) + 1e-6),
            ("jerk", np.abs(j) > jmax * (1 + 1e-5) + 1e-3),
        ]
        for label, mask in checks:
            if mask.any():
                k, i = np.argwhere(mask)[0]
                bad.append(f"{label} of {env.joints[i].name} at step {k}: {c[k, i]}")
        tools = tool_positions(x)
        box_lo, box_hi = np.array(env.box_min_m), np.array(env.box_max_m)
        out = np.any((tools[1:] < box_lo - 1e-12) | (tools[1:] > box_hi + 1e-12), axis=1)
        if out.any():
            bad.append(f"tool outside the box at step {int(np.argmax(out))}")
        speed = np.linalg.norm(np.diff(tools, axis=0), axis=1) / dt[:, 0]
        fast = speed > env.max_tool_speed_m_s * sc[:, 0] * (1 + 1e-9)
        if fast.any():
            k = int(np.argmax(fast))
            bad.append(f"tool speed {speed[k]} at step {k}")
        return bad


def _names(rng: np.random.Generator, style: str) -> tuple[list[str] | None, list[int]]:
    """Return (names sent, permutation) for a name style; permutation maps sent -> joint."""
    perm = list(range(len(NAMES)))
    if style == "none":
        return None, perm
    if style == "reordered":
        rng.shuffle(perm)
    return [NAMES[i] for i in perm], perm


def _command(rng: np.random.Generator, attack: str, x: np.ndarray, target: np.ndarray,
             k: int) -> np.ndarray:
    lo = np.array([j.lower_rad for j in ENV.joints])
    hi = np.array([j.upper_rad for j in ENV.joints])
    if attack == "jumps":
        return target
    if attack == "noise":
        return rng.uniform(-6.0, 6.0, x.size)
    if attack == "limits":
        return np.where(target > 0, hi + 1.0, lo - 1.0)
    if attack == "huge":
        return rng.choice([-1e12, 1e12, -1e6, 1e6], x.size)
    if attack == "smooth":
        return HOME + 0.3 * np.sin(0.02 * k + np.arange(x.size))
    if attack == "chatter":
        return x + rng.choice([-0.3, 0.3], x.size)
    return x + rng.normal(0.0, 0.05, x.size)  # "drift": near the current command


ATTACKS = ["jumps", "noise", "limits", "huge", "smooth", "chatter", "drift"]
DT_STYLES = ["nominal", "jitter", "adversarial"]


def _dt(rng: np.random.Generator, style: str) -> float:
    if style == "nominal" or rng.random() < 0.6:
        return PERIOD
    if style == "jitter":
        return float(rng.uniform(0.5 * PERIOD, 2.0 * PERIOD))
    return float(rng.choice([0.0, -PERIOD, math.nan, math.inf, -math.inf, 1e9, 1e-12,
                             3.0 * PERIOD, 0.4 * PERIOD, PERIOD]))


@st.composite
def scenarios(draw: Any) -> dict[str, Any]:
    return {
        "seed": draw(st.integers(0, 2**32 - 1)),
        "attacks": draw(st.lists(st.sampled_from(ATTACKS), min_size=1, max_size=3)),
        "dt": draw(st.sampled_from(DT_STYLES)),
        "names": draw(st.sampled_from(["none", "ordered", "reordered"])),
        "specials": draw(st.lists(st.sampled_from(SPECIALS), max_size=6)),
        "bad_rate": draw(st.sampled_from([0.0, 0.02, 0.2])),
        "scale": draw(st.sampled_from([1.0, ENV.limited_scale])),
        "tight": draw(st.booleans()),
        "start": draw(st.floats(-0.4, 0.4)),
    }


def _corrupt(rng: np.random.Generator, values: list[Any], names: list[str] | None,
             specials: list[float]) -> tuple[list[str] | None, list[Any]]:
    """Make one command invalid in one of the ways a buggy or hostile source could."""
    kind = int(rng.integers(6))
    values = list(values)
    if kind == 0 and specials:
        values[int(rng.integers(len(values)))] = specials[int(rng.integers(len(specials)))]
    elif kind == 1:
        values = values[:-1] if rng.random() < 0.5 else values + [0.0]
    elif kind == 2:
        names = list(names or NAMES)
        names[int(rng.integers(len(names)))] = "gripper_joint"
    elif kind == 3:
        names = list(names or NAMES)
        names[0] = names[1]
    elif kind == 4:
        values[0] = "not-a-number"
    else:
        values[int(rng.integers(len(values)))] = math.nan
    return names, values


BATCH = 500


@FUZZ
@given(scenarios())
def test_no_emitted_position_command_leaves_the_envelope(tight_envelope: Envelope,
                                                         sc: dict[str, Any]) -> None:
    env = tight_envelope if sc["tight"] else ENV
    rng = np.random.default_rng(sc["seed"])
    proj = Projector(env, ARM, PERIOD, scale=sc["scale"])
    q0 = HOME + sc["start"] * (0.1 if sc["tight"] else 1.0)
    assert proj.reset(list(q0))
    check = Checker.start(env, sc["scale"], proj.x)
    names, perm = _names(rng, sc["names"])
    target = HOME.copy()
    x = np.array(proj.x)
    for k in range(BATCH):
        attack = sc["attacks"][k % len(sc["attacks"])]
        if rng.random() < 0.05:
            target = rng.uniform(-3.5, 3.5, HOME.size)
        cmd = _command(rng, attack, x, target, k)
        values: list[Any] = [float(cmd[i]) for i in perm]
        sent_names = names
        if rng.random() < sc["bad_rate"]:
            sent_names, values = _corrupt(rng, values, names, sc["specials"])
        measured: Any = list(x) if rng.random() < 0.9 else [math.nan] * HOME.size
        res = proj.project_position(sent_names, values, _dt(rng, sc["dt"]), measured)
        check.add(res.command, res.dt_s)
        x = np.array(res.command)
        for e in res.events:
            assert e.kind and (e.limit or e.detail)
    bad = check.verify()
    assert not bad, bad[:3]
    COUNTS["position"] = COUNTS.get("position", 0) + check.n


def test_position_fuzz_pushed_enough_commands() -> None:
    assert COUNTS.get("position", 0) >= 110 * BATCH


def test_independent_checker_kinematics_match_the_arm_model() -> None:
    rng = np.random.default_rng(7)
    q = rng.uniform(ARM.lower_rad, ARM.upper_rad, (20, ARM.n_joints))
    expected = np.array([ARM.tool_position(row) for row in q])
    assert np.allclose(tool_positions(q), expected, atol=1e-12)


def test_checker_catches_a_violation() -> None:
    """The checker is what the fuzz relies on: it must fail on a rate-limit breach."""
    check = Checker.start(ENV, 1.0, HOME)
    bumped = HOME.copy()
    bumped[0] += 0.1  # 10 rad/s in one period
    check.add(list(bumped), PERIOD)
    assert any("velocity" in b for b in check.verify())


@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1), st.sampled_from(DT_STYLES), st.sampled_from([1.0, 0.5]))
def test_velocity_commands_respect_rate_limits_and_keep_the_joint_inside(
        seed: int, dt_style: str, scale: float) -> None:
    rng = np.random.default_rng(seed)
    proj = Projector(ENV, ARM, PERIOD, scale=scale)
    q = HOME + rng.uniform(-0.3, 0.3, HOME.size)
    proj.reset(list(q))
    u_prev = np.zeros(HOME.size)
    a_prev = np.zeros(HOME.size)
    vmax = np.array([j.velocity_rad_s for j in ENV.joints]) * scale
    amax = np.array([j.acceleration_rad_s2 for j in ENV.joints]) * scale
    jmax = np.array([j.jerk_rad_s3 for j in ENV.joints]) * scale
    lo = np.array([j.lower_rad for j in ENV.joints])
    hi = np.array([j.upper_rad for j in ENV.joints])
    us, dts, qs = [], [], []
    for k in range(500):
        req: list[Any] = list(rng.choice([-5.0, 5.0, 0.0], HOME.size)
                              if rng.random() < 0.7 else rng.normal(0, 2, HOME.size))
        if rng.random() < 0.05:
            req[int(rng.integers(HOME.size))] = SPECIALS[int(rng.integers(len(SPECIALS)))]
        res = proj.project_velocity(None, req, _dt(rng, dt_style), list(q))
        # The arm integrates the velocity command exactly here.
        q = q + np.asarray(res.command) * res.dt_s
        us.append(res.command)
        dts.append(res.dt_s)
        qs.append(q)
    u = np.array(us)
    dt = np.array(dts)[:, None]
    a = np.diff(np.vstack([u_prev, u]), axis=0) / dt
    j = np.diff(np.vstack([a_prev, a]), axis=0) / dt
    assert np.all(np.abs(u) <= vmax * (1 + 1e-9)), np.argwhere(np.abs(u) > vmax)[:3]
    assert np.all(np.abs(a) <= amax * (1 + 1e-7) + 1e-6), np.argwhere(np.abs(a) > amax)[:3]
    assert np.all(np.abs(j) <= jmax * (1 + 1e-5) + 1e-3), np.argwhere(np.abs(j) > jmax)[:3]
    qa = np.array(qs)
    assert np.all(qa >= lo - 1e-9) and np.all(qa <= hi + 1e-9)
    n = len(us)
    COUNTS["velocity"] = COUNTS.get("velocity", 0) + n


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(st.lists(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(
    SPECIALS)), min_size=0, max_size=8), st.sampled_from([1.0, 0.5]))
def test_effort_and_wrench_commands_are_clipped_or_rejected(values: list[float],
                                                            scale: float) -> None:
    proj = Projector(ENV, ARM, PERIOD, scale=scale)
    rng = np.random.default_rng(len(values))
    n = 0
    for k in range(250):
        req = values if k == 0 else list(rng.normal(0, 500, rng.integers(5, 8)))
        q = list(HOME + rng.uniform(-3, 3, HOME.size))
        res = proj.project_effort(None, req, q, [0.0] * 6)
        for i, je in enumerate(ENV.joints):
            assert abs(res.command[i]) <= je.effort_nm * scale + 1e-9
        w = proj.project_wrench(req[:6] if len(req) >= 6 else req)
        lim = ENV.commanded
        f, t = np.array(w.wrench[:3]), np.array(w.wrench[3:])
        assert np.all(np.isfinite(w.wrench))
        assert np.linalg.norm(f) <= lim.max_force_n * scale + 1e-9
        assert np.linalg.norm(t) <= lim.max_torque_nm * scale + 1e-9
        assert np.all(np.abs(f) <= np.array(lim.max_force_per_axis_n) * scale + 1e-9)
        assert np.all(np.abs(t) <= np.array(lim.max_torque_per_axis_nm) * scale + 1e-9)
        n += 2
    COUNTS["effort_wrench"] = COUNTS.get("effort_wrench", 0) + n


@st.composite
def supervisor_scripts(draw: Any) -> dict[str, Any]:
    return {
        "seed": draw(st.integers(0, 2**32 - 1)),
        "stage": draw(st.sampled_from(["shadow", "advisory", "limited", "full"])),
        "stamp_skew_s": draw(st.sampled_from([0.0, 0.5, -0.5, 1e6, -1e6, math.nan])),
        "skew_rate": draw(st.sampled_from([0.0, 0.05, 0.3])),
        "confidence": draw(st.sampled_from(["good", "spiky", "nan", "absent"])),
        "clock_jumps": draw(st.booleans()),
    }


@settings(max_examples=50, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(supervisor_scripts())
def test_supervisor_never_raises_and_never_emits_outside_the_envelope(
        sc: dict[str, Any]) -> None:
    rng = np.random.default_rng(sc["seed"])
    cfg = SupervisorConfig(calm_period_s=0.05, invalid_estop_count=50)
    sup = Supervisor(ENV, ARM, cfg, stage=sc["stage"])
    scale = ENV.limited_scale if sc["stage"] == "limited" else 1.0
    check: Checker | None = None
    q = HOME.copy()
    t = 100.0
    for k in range(400):
        if sc["clock_jumps"] and rng.random() < 0.01:
            t += float(rng.choice([-5.0, 3.0]))
        t += PERIOD

        def stamp() -> float:
            if rng.random() < sc["skew_rate"]:
                return t + sc["stamp_skew_s"] * float(rng.random())
            return t

        if rng.random() < 0.95:
            sup.on_joint_state(t, stamp(), list(q) if rng.random() < 0.97 else [math.nan] * 6,
                               [0.0] * 6)
        cmd = _command(rng, ATTACKS[k // 50 % len(ATTACKS)], q, HOME + 0.5, k)
        names: list[str] | None = NAMES
        values: list[Any] = list(cmd)
        if rng.random() < 0.05:
            names, values = _corrupt(rng, values, names, SPECIALS)
        if rng.random() < 0.9:
            sup.on_policy_command(t, stamp(), names, values)
        if sc["confidence"] != "absent":
            d = {"good": 0.01, "spiky": float(rng.choice([0.01, 0.5])), "nan": math.nan}[
                sc["confidence"]]
            sup.on_confidence(t, stamp(), d, float(rng.uniform(0, 4)))
        if rng.random() < 0.9:
            sup.on_baseline_command(t, stamp(), None, list(q + rng.normal(0, 0.01, 6)))
        if rng.random() < 0.05:
            sup.on_wrench(t, stamp(), list(rng.normal(0, 100, 6)))
        if rng.random() < 0.02:
            sup.reset_estop(t)
        res = sup.tick(t, PERIOD)
        if not res.command:
            continue
        if check is None:
            # Start from the projector's own state (it began at the measured position).
            pr = sup.projector
            check = Checker.start(ENV, pr.scale, pr.x, pr.v, pr.a)
            q = np.array(res.command)
            continue
        # A stage change may tighten the envelope while moving: the command then slows down
        # at the old limits, so check against the looser of the two.
        check.scale = max(check.scale, sup.projector.scale)
        check.add(res.command, PERIOD)
        q = np.array(res.command)
    if check is not None:
        bad = check.verify()
        assert not bad, bad[:3]
        COUNTS["supervisor"] = COUNTS.get("supervisor", 0) + check.n


def test_fuzz_total_reaches_one_hundred_thousand_commands() -> None:
    total = sum(COUNTS.values())
    assert set(COUNTS) == {"position", "velocity", "effort_wrench", "supervisor"}, COUNTS
    assert total >= 100_000, COUNTS
