"""Bounded action projection: every emitted command lies inside the safety envelope.

Position and velocity commands are treated as one sampled trajectory per joint. With the control
period dt, the emitted sequence c_k defines the finite differences the drive sees:
v_k = (c_k - c_{k-1}) / dt, a_k = (v_k - v_{k-1}) / dt, j_k = (a_k - a_{k-1}) / dt. The projector
chooses, per joint, the jerk closest to the one the request implies such that

* |j_k| <= J, |a_k| <= A, |v_k| <= V and lo <= c_k <= hi (the envelope, scaled in `limited`), and
* the new state is *viable*: a jerk-limited brake from it stops inside [lo, hi] without exceeding
  V. That is what makes the limits satisfiable at every later step: a projector that only clips
  positions and rates runs into a position limit faster than its acceleration can stop it.

The Cartesian limits couple the joints. The tool must stay inside the workspace box and its speed
under the maximum; both are checked on the forward kinematics of the candidate with a reserve for
the braking distance still ahead, and when the candidate fails, every joint brakes instead (the
projector keeps the previous safe trajectory and stops along it; an instant hold would itself
break the acceleration and jerk limits). Wrench commands are clipped per axis and by norm; effort
commands to the effort limits. Invalid input (NaN, infinities, wrong lengths, unknown or repeated
joint names, zero/negative/non-finite dt) never raises: the command is rejected, the joints brake,
and an event says why. Deterministic: no randomness, no clocks.

`Projector.project_position` runs on a C core (`_projection.c`, the same arithmetic bit for bit)
when the extension is built; this module stays the reference and the fallback. `BACKEND` names
the default; `native=False` or the environment variable SIM2REAL_SAFETY_PYTHON=1 force Python.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from sim2real_ros.robot.model import ArmModel
from sim2real_ros.safety.envelope import Envelope, ForceLimits
from sim2real_ros.safety.events import INTERVENTION, INVALID_COMMAND, INVALID_INPUT, SafetyEvent
from sim2real_ros.safety.kinematics import ToolKinematics

try:  # the C core of project_position (optional build; this module is its reference)
    from sim2real_ros.safety import _projection as _native  # type: ignore
except ImportError:  # pragma: no cover - depends on the build
    _native = None
NATIVE_AVAILABLE = _native is not None
# Set to 1 to run every Projector on the Python reference (tests, debugging).
FORCE_PYTHON_ENV = "SIM2REAL_SAFETY_PYTHON"
BACKEND = ("native" if NATIVE_AVAILABLE and os.environ.get(FORCE_PYTHON_ENV, "") in ("", "0")
           else "python")

POSITION, VELOCITY, EFFORT = "position", "velocity", "effort"
MODES = (POSITION, VELOCITY, EFFORT)

# Internal limits sit this fraction inside the envelope so float rounding of the finite
# differences (a jerk is a third difference divided by dt^3) never reads as a violation.
_SHRINK = 1e-6
# Commands within this of the request are not an intervention.
_TOL_ABS = 1e-9
# Differences this small (relative) are float rounding of the state update, not an intervention.
_SNAP = 1e-13
_BISECT_STEPS = 10
# The root search of _viable_jerk stops at the bracket _BISECT_STEPS bisection steps leave
# or with the good end this close (rad) to the viability boundary.
_ROOT_WIDTH = 0.5 ** _BISECT_STEPS
_ROOT_TOL = 1e-12
_CARTESIAN_STEPS = 3
# Gains of the recovery cascade, per control period (stable for any dt), and the share of the
# next derivative's limit its square-root laws may plan with (the rest absorbs the lag).
_POS_GAIN = 0.08
_VEL_GAIN = 0.25
_LIMIT_SHARE = 0.5
# Accepted control periods relative to the nominal one; outside, the nominal period is used.
DT_MIN_FRACTION = 0.5
DT_MAX_FRACTION = 2.0
# Limits of _why in the order of the C core's codes.
_WHY_LIMITS = ("position", "velocity", "acceleration", "jerk", "braking")
_BRAKING_DETAIL = ("request within the rate limits but not stoppable inside the envelope from "
                   "where it leads")


@dataclass(slots=True)
class Projection:
    """One projected command and what the projector did to it."""

    command: list[float]
    mode: str
    dt_s: float
    accepted: bool  # False: the input was rejected and the joints brake
    intervened: bool  # True: the emitted command differs from the (valid) request
    events: list[SafetyEvent] = field(default_factory=list)
    braking: bool = False  # the Cartesian check failed (or input invalid): all joints brake
    deviation: float = 0.0  # largest |emitted - requested| over the joints (rad, rad/s, N·m)


@dataclass
class WrenchProjection:
    """A commanded wrench clipped to the commanded-force limits."""

    wrench: list[float]
    accepted: bool
    intervened: bool
    events: list[SafetyEvent] = field(default_factory=list)


def _d0(v: float, amax: float, jmax: float) -> float:
    """Distance to stop from velocity v >= 0 at zero acceleration (jerk-limited brake)."""
    if v * jmax < amax * amax:
        return v * math.sqrt(v / jmax)
    return 0.5 * v * (v / amax + amax / jmax)


def excursion_up(v: float, a: float, amax: float, jmax: float) -> float:
    """Furthest travel in + direction while braking as hard as the limits allow from (v, a)."""
    if v < 0.0:
        if a <= 0.0:
            return 0.0
        disc = a * a + 2.0 * jmax * v
        if disc <= 0.0:
            return 0.0  # the velocity never turns positive while the acceleration ramps down
        # Continue from the instant the velocity crosses zero, acceleration still positive.
        v, a = 0.0, math.sqrt(disc)
    if a >= 0.0:
        v0 = v + a * a / (2.0 * jmax)
        return v * a / jmax + a * a * a / (3.0 * jmax * jmax) + _d0(v0, amax, jmax)
    if a * a <= 2.0 * jmax * v:
        # On the braking profile that started from (v0, 0): subtract the part already done.
        v0 = v + a * a / (2.0 * jmax)
        t = -a / jmax
        return max(0.0, _d0(v0, amax, jmax) - (v0 * t - jmax * t * t * t / 6.0))
    # Decelerating harder than needed: the velocity reaches zero while the jerk is +J.
    t = (-a - math.sqrt(a * a - 2.0 * jmax * v)) / jmax
    return max(0.0, v * t + 0.5 * a * t * t + jmax * t * t * t / 6.0)


def peak_velocity_up(v: float, a: float, jmax: float) -> float:
    """Highest velocity reached while the acceleration is ramped to zero at the jerk limit."""
    return v + a * a / (2.0 * jmax) if a > 0.0 else v


class _Joint:
    """Per-joint limits as plain floats (the hot path reads attributes, not arrays)."""

    __slots__ = ("name", "lo", "hi", "env_lo", "env_hi", "vmax", "amax", "jmax", "effort",
                 "reserve", "inv_j", "inv_2j", "inv_3j2",
                 "inv_2a", "a_over_2j")

    def __init__(self, name: str, lo: float, hi: float, vmax: float, amax: float, jmax: float,
                 effort: float, dt_max: float) -> None:
        self.name = name
        self.env_lo, self.env_hi = lo, hi
        self.vmax = vmax * (1.0 - _SHRINK)
        self.amax = amax * (1.0 - _SHRINK)
        self.jmax = jmax * (1.0 - _SHRINK)
        self.effort = effort
        # Braking reserve: the discrete brake can differ from the continuous one by about one
        # jerk step at each of its phase switches.
        self.reserve = 2.0 * jmax * dt_max ** 3 + 1e-6 + _SHRINK * (abs(lo) + abs(hi))
        half = 0.5 * (hi - lo)
        self.reserve = min(self.reserve, 0.25 * half)
        self.lo, self.hi = lo + self.reserve, hi - self.reserve
        # Constants of the closed-form brake bounds of the fast paths.
        self.inv_j = 1.0 / self.jmax
        self.inv_2j = 0.5 / self.jmax
        self.inv_3j2 = 1.0 / (3.0 * self.jmax * self.jmax)
        self.inv_2a = 0.5 / self.amax
        self.a_over_2j = 0.5 * self.amax / self.jmax


def _clearly_viable(jt: _Joint, x: float, v: float, a: float) -> bool:
    """Cheap sufficient test of viability with closed-form upper bounds of the brake.

    w = |v| + a^2/(2J) bounds the speed reached while the acceleration ramps to zero, and
    E = |v||a|/J + |a|^3/(3J^2) + w^2/(2A) + wA/(2J) bounds the travel of the jerk-limited stop
    in either direction; if both fit, the exact (slower) test is not needed.
    """
    av = v if v >= 0.0 else -v
    aa = a if a >= 0.0 else -a
    w = av + aa * aa * jt.inv_2j
    if w > jt.vmax:
        return False
    e = av * aa * jt.inv_j + aa * aa * aa * jt.inv_3j2 + w * (w * jt.inv_2a + jt.a_over_2j)
    return jt.lo + e <= x <= jt.hi - e


def _stoppable(jt: _Joint, x: float, v: float, a: float) -> bool:
    """True when the state (x, v, a) is inside jt's rate limits and clearly viable under them."""
    return -jt.amax <= a <= jt.amax and -jt.vmax <= v <= jt.vmax and _clearly_viable(
        jt, x, v, a)


def _violation_up(jt: _Joint, x: float, v: float, a: float, j: float, dt: float) -> float:
    """How far the successor under jerk j breaks the upper position/velocity viability (<=0 ok)."""
    a2 = a + j * dt
    v2 = v + a2 * dt
    x2 = x + v2 * dt
    return max(x2 + excursion_up(v2, a2, jt.amax, jt.jmax) - jt.hi,
               (peak_velocity_up(v2, a2, jt.jmax) - jt.vmax) * dt)


def _violation_low(jt: _Joint, x: float, v: float, a: float, j: float, dt: float) -> float:
    """How far the successor under jerk j breaks the lower position/velocity viability (<=0 ok)."""
    a2 = a + j * dt
    v2 = v + a2 * dt
    x2 = x + v2 * dt
    return max(jt.lo - (x2 - excursion_up(-v2, -a2, jt.amax, jt.jmax)),
               (peak_velocity_up(-v2, -a2, jt.jmax) - jt.vmax) * dt)


def _viable_jerk(jt: _Joint, x: float, v: float, a: float, jd: float, dt: float) -> float:
    """Return the jerk closest to jd that keeps the joint viable (least violation if none does)."""
    amax, jmax = jt.amax, jt.jmax
    jlo = max(-jmax, (-amax - a) / dt)
    jhi = min(jmax, (amax - a) / dt)
    if jlo > jhi:
        # |a| > A: only possible after the envelope was scaled down; reduce |a| at the jerk limit.
        jlo = jhi = -jmax if a > 0.0 else jmax
    j = jd if jlo <= jd <= jhi else (jlo if jd < jlo else jhi)
    a2 = a + j * dt
    v2 = v + a2 * dt
    x2 = x + v2 * dt
    # Fast path: far from both limits and slow enough that no brake can break a limit.
    if _clearly_viable(jt, x2, v2, a2):
        return j
    up = _violation_up(jt, x, v, a, j, dt)
    low = _violation_low(jt, x, v, a, j, dt)
    if up <= 0.0 and low <= 0.0:
        return j
    if up > 0.0:
        f_lo = _violation_up(jt, x, v, a, jlo, dt)
        if f_lo > 0.0:
            j = jlo
        else:
            j = _root(_violation_up, jt, x, v, a, dt, jlo, f_lo, j, up)
        if _violation_low(jt, x, v, a, j, dt) <= 0.0:
            return j
    else:
        f_hi = _violation_low(jt, x, v, a, jhi, dt)
        if f_hi > 0.0:
            j = jhi
        else:
            j = _root(_violation_low, jt, x, v, a, dt, jhi, f_hi, j, low)
        if _violation_up(jt, x, v, a, j, dt) <= 0.0:
            return j
    # Both sides cannot be satisfied (a state left non-viable by a scale change): minimise the
    # larger violation; the upper one rises and the lower one falls with j.
    lo_j, hi_j = jlo, jhi
    for _ in range(_BISECT_STEPS):
        mid = 0.5 * (lo_j + hi_j)
        if _violation_up(jt, x, v, a, mid, dt) > _violation_low(jt, x, v, a, mid, dt):
            hi_j = mid
        else:
            lo_j = mid
    return 0.5 * (lo_j + hi_j)


def _root(violation: Callable[[_Joint, float, float, float, float, float], float],
          jt: _Joint, x: float, v: float, a: float, dt: float,
          good: float, f_good: float, bad: float, f_bad: float) -> float:
    """Move from a jerk that satisfies `violation <= 0` towards one that does not.

    Returns the last jerk found with violation <= 0, so the result keeps the joint viable by
    the same exact test as every other path. It ends, like _BISECT_STEPS bisection steps,
    with the bracket 2^-_BISECT_STEPS of its start (or the good end's violation within
    _ROOT_TOL of zero). The violation is monotone in the jerk and mostly smooth and convex,
    so each trial is the secant through the last two good points (which lands just past the
    boundary on a convex violation) or else regula falsi on the bracket; a trial within the
    final width of an end moves to half that width from it, so either outcome can close the
    bracket; and a bisection step where the violation has a kink (the binding limit changes)
    and three trials did not halve the bracket, or where only the evaluations bisection would
    need are left. Typically 3 to 5 evaluations instead of _BISECT_STEPS; at most twice that.
    """
    width = (bad - good) * _ROOT_WIDTH
    if width < 0.0:
        width = -width
    prev = f_prev = math.nan  # the good end before the last one, if the good end just moved
    gap1 = gap2 = gap3 = math.inf  # the bracket one, two and three evaluations ago
    budget = 2 * _BISECT_STEPS
    for k in range(budget):
        gap = bad - good
        if gap < 0.0:
            gap = -gap
        if gap <= width or f_good >= -_ROOT_TOL:
            break
        if gap > 0.5 * gap3 or width * 2.0 ** (budget - k - 1) <= gap:
            # Stalled on a kink, or only the evaluations bisection needs are left: bisect.
            mid = 0.5 * (good + bad)
            gap1 = gap2 = gap3 = math.inf
        else:
            mid = math.nan
            if f_prev == f_prev and f_good != f_prev:
                mid = good - f_good * (good - prev) / (f_good - f_prev)
            if not (good < mid < bad or bad < mid < good):  # also catches NaN
                mid = good + (bad - good) * (f_good / (f_good - f_bad))
            gap3, gap2, gap1 = gap2, gap1, gap
            # A trial within the final width of an end moves to half that width from it, so
            # either outcome can close the bracket.
            step = mid - good
            if (step if step >= 0.0 else -step) < width:
                mid = good + 0.5 * width if bad > good else good - 0.5 * width
            else:
                step = bad - mid
                if (step if step >= 0.0 else -step) < width:
                    mid = bad - 0.5 * width if bad > good else bad + 0.5 * width
        f_mid = violation(jt, x, v, a, mid, dt)
        if f_mid <= 0.0:
            prev, f_prev = good, f_good
            good, f_good = mid, f_mid
        else:
            bad, f_bad = mid, f_mid
            prev = f_prev = math.nan
    return good


def sqrt_controller(error: float, gain: float, second_order_limit: float, dt: float) -> float:
    """Proportional near zero, square root far away: reaches zero error without overshoot.

    The correction a limited next derivative can take back in time (ArduPilot's
    sqrt_controller): for a position error, the velocity from which the acceleration limit
    still stops at the target; for a velocity error, the acceleration the jerk limit can undo.
    """
    linear = second_order_limit / (gain * gain)
    if error > linear:
        c = math.sqrt(2.0 * second_order_limit * (error - 0.5 * linear))
    elif error < -linear:
        c = -math.sqrt(2.0 * second_order_limit * (-error - 0.5 * linear))
    else:
        c = error * gain
    lim = abs(error) / dt
    return c if -lim <= c <= lim else (lim if c > 0.0 else -lim)


def _regula_falsi(lo: float, lo_s: float, lo_b: float, hi: float, hi_s: float,
                  hi_b: float) -> float:
    """Where the linear interpolation of the first constraint margin to cross zero does.

    Two margins (tool speed, box; <= 0 passes) known at the shares lo (passing) and hi:
    the smallest share in [lo, hi] at which either interpolated margin reaches zero.
    """
    share = hi
    if hi_s > 0.0:
        share = lo + (hi - lo) * (lo_s / (lo_s - hi_s))
    if hi_b > 0.0:
        sb = lo + (hi - lo) * (lo_b / (lo_b - hi_b))
        if sb < share:
            share = sb
    return share


# The brake's end game plans exact stops of up to this many ticks (see _endgame_jerk).
_STOP_TICKS_MAX = 12
# Relative slack of the end game's reachability test (float rounding of the scaled state).
_STOP_TOL = 1e-9


def _stop_q_max(n: int, s: float) -> float:
    """Largest sum_i (n + 1 - i) u_i over u in [-1, 1]^n with sum_i u_i = s, |s| <= n.

    The +1s go first (the heaviest weights): m of them, one fractional step, then -1s.
    """
    t = 0.5 * (s + n)
    m = math.floor(t)
    if m >= n:
        return 0.5 * n * (n + 1)
    f = t - m
    return -0.5 * n * (n + 1) + 2.0 * (m * n - 0.5 * m * (m - 1)) + 2.0 * f * (n - m)


def _stop_u1_max(n: int, s: float) -> float:
    """The first step of the sequence that attains _stop_q_max(n, s)."""
    t = 0.5 * (s + n)
    return 1.0 if math.floor(t) >= 1 else -1.0 + 2.0 * t


def _stops_in(n: int, p: float, w: float) -> bool:
    """True when the scaled state (p, w) can be brought to rest in exactly n ticks (n >= 1).

    Scaled by the jerk limit J and the tick dt: w = a / (J dt), p = v / (J dt^2) and the step
    u = j / J in [-1, 1], so one tick is w' = w + u, p' = p + w'. After n ticks w_n = w + sum u
    and p_n = p + n w + sum_i (n + 1 - i) u_i, so rest needs sum u = -w and the weighted sum
    q = -p - n w, which a box of u reaches iff q lies between the two extreme sums.
    """
    s = -w
    if s > n + _STOP_TOL or s < -n - _STOP_TOL:
        return False
    if s > n:
        s = float(n)
    elif s < -n:
        s = float(-n)
    q = -p - n * w
    eps = _STOP_TOL * (1.0 + (q if q >= 0.0 else -q))
    return -_stop_q_max(n, -s) - eps <= q <= _stop_q_max(n, s) + eps


def _endgame_jerk(v: float, a: float, j: float, jmax: float, dt: float) -> float:
    """The brake's jerk j, replaced near rest by a step of the fewest-ticks exact stop.

    The hardest-stop law of _brake_jerk is the continuous-time one sampled at dt. Near rest it
    overshoots by about a jerk step, turns round and, from about 7 % of states, falls into a
    limit cycle: the held command chatters by ~1e-4 rad at ~12 Hz and creeps (seen as the
    flaky hold of the fault suite on a loaded host). Here, once (v, a) can be stopped exactly
    within _STOP_TICKS_MAX ticks (the fewest n found by _stops_in), j is kept if it leaves a
    state that stops in n - 1 ticks, and otherwise replaced by the first step of one n-tick
    exact stop (the blend of the two extreme sequences that meets the weighted sum). So the
    ticks left to rest fall by one every tick: no cycle, rest within n ticks. The acceleration
    limit is left to the caller's clamp, as for every brake jerk.
    """
    h = jmax * dt
    w = a / h
    p = v / (h * dt)
    aw = w if w >= 0.0 else -w
    ap = p if p >= 0.0 else -p
    nmax = _STOP_TICKS_MAX
    if aw > nmax + _STOP_TOL or ap > 0.5 * nmax * (nmax + 1) + nmax * aw + 1.0:
        return j  # cannot stop within nmax ticks: far from rest
    n = 1
    while True:
        # |w| <= n and |p + n w| <= n (n + 1) / 2 are necessary: the cheap test first.
        r = p + n * w
        ar = r if r >= 0.0 else -r
        if (aw <= n + _STOP_TOL and ar - _STOP_TOL * (1.0 + ar) <= 0.5 * n * (n + 1)
                and _stops_in(n, p, w)):
            break
        n += 1
        if n > nmax:
            return j
    u = j / jmax
    if n > 1 and _stops_in(n - 1, p + w + u, w + u):
        return j
    s = -w
    if s > n:
        s = float(n)
    elif s < -n:
        s = float(-n)
    q = -p - n * w
    hi = _stop_q_max(n, s)
    lo = -_stop_q_max(n, -s)
    lam = 0.5
    if hi > lo:
        lam = (q - lo) / (hi - lo)
        if lam < 0.0:
            lam = 0.0
        elif lam > 1.0:
            lam = 1.0
    return (lam * _stop_u1_max(n, s) - (1.0 - lam) * _stop_u1_max(n, -s)) * jmax


def _brake_jerk(jt: _Joint, v: float, a: float, dt: float) -> float:
    """Jerk of the hardest jerk-limited stop from (v, a), as one constant step of length dt.

    Far from rest the continuous-time hardest stop; near rest an exact stop in the fewest ticks
    (_endgame_jerk), so the brake comes to rest instead of cycling around it.
    """
    amax, jmax = jt.amax, jt.jmax
    jlo = max(-jmax, (-amax - a) / dt)
    jhi = min(jmax, (amax - a) / dt)
    if jlo > jhi:
        return -jmax if a > 0.0 else jmax
    # Settle: close enough to rest to stop exactly in two steps.
    if abs(v) <= 0.5 * jmax * dt * dt and abs(a) <= 0.5 * jmax * dt:
        j = (-v / dt - a) / dt
        return min(max(j, jlo), jhi)
    s = 1.0 if (v > 0.0 or (v == 0.0 and a > 0.0)) else -1.0
    vs, as_ = s * v, s * a
    if as_ < 0.0 and as_ * as_ >= 2.0 * jmax * vs:
        jm = as_ * as_ / (2.0 * vs) if vs > 0.0 else jmax  # final ramp back to zero acceleration
    elif as_ <= -amax:
        jm = 0.0
    else:
        jm = -jmax
    j = _endgame_jerk(v, a, s * min(jm, jmax), jmax, dt)
    return min(max(j, jlo), jhi)


def _workspace_detail(px: float, py: float, pz: float, dist: float, tail: float) -> str:
    return (f"tool at ({px:.3f}, {py:.3f}, {pz:.3f}) m is {dist:.4f} m inside the box; "
            f"braking may need {tail:.4f} m")


def _tool_speed_detail(speed: float, speed_max: float) -> str:
    return f"tool speed bound {speed:.4f} m/s > {speed_max:.4f} m/s"


class Projector:
    """Projects joint, effort and wrench commands into an envelope; keeps the command state."""

    def __init__(self, envelope: Envelope, arm: ArmModel, period_s: float, scale: float = 1.0,
                 box_margin_m: float = 0.002, tool_speed_margin: float = 0.02,
                 native: bool | None = None) -> None:
        """`native`: None uses `BACKEND`; False the Python reference; True requires the C core."""
        if native and not NATIVE_AVAILABLE:
            raise RuntimeError("native=True but sim2real_ros.safety._projection is not built")
        self._use_native = BACKEND == "native" if native is None else native
        self._core: object | None = None
        if envelope.joint_names != arm.joint_names:
            raise ValueError(f"envelope joints {envelope.joint_names} != arm joints "
                             f"{arm.joint_names}")
        if not (math.isfinite(period_s) and period_s > 0.0):
            raise ValueError(f"period_s must be a positive number, got {period_s!r}")
        self.envelope = envelope
        self.arm = arm
        self.joint_names = list(envelope.joint_names)
        self.n = len(self.joint_names)
        self._index = {n: i for i, n in enumerate(self.joint_names)}
        self.period_s = float(period_s)
        self.dt_min_s = DT_MIN_FRACTION * self.period_s
        self.dt_max_s = DT_MAX_FRACTION * self.period_s
        self.kin = ToolKinematics(arm, envelope.tool_link)
        self._fk = self.kin.fast_tool_position_and_levers
        self._box_margin = box_margin_m
        self._tool_speed_margin = tool_speed_margin
        self._box_lo = list(envelope.box_min_m)
        self._box_hi = list(envelope.box_max_m)
        self.effort_hold_kp = [min(200.0, j.effort_nm / 0.2) for j in envelope.joints]
        self.effort_hold_kd = [0.1 * kp for kp in self.effort_hold_kp]
        self.scale = 1.0
        self.set_scale(scale)
        # Command state: last emitted positions and their finite-difference rates.
        self.x = [0.0] * self.n
        self.v = [0.0] * self.n
        self.a = [0.0] * self.n
        self.initialized = False
        self._r_prev: list[float | None] = [None] * self.n
        self._r_prev2: list[float | None] = [None] * self.n
        self._synced = [False] * self.n
        self.last_effort = [0.0] * self.n
        self._levers = [0.0] * self.n
        self._exc = [0.0] * self.n
        self._w = [0.0] * self.n
        self._drift = [0.0] * self.n
        self._jerks = [0.0] * self.n  # scratch: the candidate's jerks of project_position
        # Cache of the last forward kinematics: configuration, tool position, box distance.
        self._fk_q: list[float] | None = None
        self._fk_dist = -math.inf
        self._last_speed = self._last_tail = 0.0

    # -- configuration -------------------------------------------------------------------
    def set_scale(self, scale: float) -> None:
        """Scale rates, efforts, tool speed and commanded wrench (rollout stage `limited`).

        A smaller scale takes effect per joint once the joint's command state can stop inside
        its position limits under the scaled rates: a joint moving towards a limit that only
        the previous (larger) acceleration and jerk can stop before keeps the previous joint
        limits until it has slowed down (see `_settle_scale`). Cutting the deceleration in the
        middle of a stop would carry the command past the position envelope, which is the
        hard limit; the stage's rate tightening is not.
        """
        if not (math.isfinite(scale) and 0.0 < scale <= 1.0):
            raise ValueError(f"scale must be in (0, 1], got {scale!r}")
        lower = scale < self.scale
        self.scale = float(scale)
        target = [
            _Joint(j.name, j.lower_rad, j.upper_rad, j.velocity_rad_s * scale,
                   j.acceleration_rad_s2 * scale, j.jerk_rad_s3 * scale, j.effort_nm * scale,
                   self.dt_max_s)
            for j in self.envelope.joints
        ]
        self._scaled_joints = target
        current = getattr(self, "joints", None)
        if current is None or not lower or not getattr(self, "initialized", False):
            self.joints = list(target)
        else:
            self.joints = [t if _stoppable(t, self.x[i], self.v[i], self.a[i]) else c
                           for i, (t, c) in enumerate(zip(target, current))]
        self._scale_pending = any(j is not t for j, t in zip(self.joints, target))
        self.max_tool_speed_m_s = self.envelope.max_tool_speed_m_s * scale
        self._speed_max = self.max_tool_speed_m_s * (1.0 - self._tool_speed_margin)
        # Cascade constants per control period (see _cascade_gains).
        self._gains: list[tuple[float, float, float, float, float, float]] = []
        self._gains_dt = math.nan
        c = self.envelope.commanded
        self.commanded = ForceLimits(
            c.max_force_n * scale, c.max_torque_nm * scale,
            tuple(f * scale for f in c.max_force_per_axis_n),  # type: ignore[arg-type]
            tuple(t * scale for t in c.max_torque_per_axis_nm),  # type: ignore[arg-type]
        )
        self._core = self._native_core() if self._use_native else None

    def _settle_scale(self) -> None:
        """Give each joint still on its previous limits the scaled ones once it can stop
        inside its position limits under them (after a `set_scale` to a smaller scale)."""
        joints, target = self.joints, self._scaled_joints
        x, v, a = self.x, self.v, self.a
        changed = False
        for i, t in enumerate(target):
            if joints[i] is not t and _stoppable(t, x[i], v[i], a[i]):
                joints[i] = t
                changed = True
        if changed:
            self._scale_pending = any(j is not t for j, t in zip(joints, target))
            self._gains_dt = math.nan
            self._core = self._native_core() if self._use_native else None

    @property
    def backend(self) -> str:
        """Which implementation projects position commands: "native" or "python"."""
        return "native" if self._core is not None else "python"

    def _native_core(self) -> object | None:
        """The C core for the current limits, or None (Python path) if it cannot take them."""
        if _native is None:
            return None
        joints = [(jt.lo, jt.hi, jt.env_lo, jt.env_hi, jt.vmax, jt.amax, jt.jmax, jt.inv_j,
                   jt.inv_2j, jt.inv_3j2, jt.inv_2a, jt.a_over_2j) for jt in self.joints]
        try:
            # The chain as ToolKinematics walks it in tool_position_and_levers.
            return _native.Core(joints, self.kin._rev, self.kin._tip, self._box_lo,
                                self._box_hi, self._box_margin, self._speed_max)
        except (TypeError, ValueError):  # e.g. more joints than the core's MAX_JOINTS
            return None

    def reset(self, position: Sequence[float] | None = None) -> bool:
        """Restart the command trajectory at rest at `position` (clamped into the envelope)."""
        if position is None or len(position) != self.n or not all(
                math.isfinite(p) for p in position):
            return False
        if self._scale_pending:  # at rest every joint can stop under the scaled limits
            self.joints = list(self._scaled_joints)
            self._scale_pending = False
            self._gains_dt = math.nan
            self._core = self._native_core() if self._use_native else None
        self.x = [min(max(float(p), jt.lo), jt.hi) for p, jt in zip(position, self.joints)]
        self.v = [0.0] * self.n
        self.a = [0.0] * self.n
        self.initialized = True
        self._fk_q = None
        self._r_prev = [None] * self.n
        self._r_prev2 = [None] * self.n
        self._synced = [False] * self.n
        return True

    # -- input checks --------------------------------------------------------------------
    def order(self, names: Sequence[str] | None, values: Sequence[float]) -> list[float] | str:
        """Return values in joint order, or the reason the command is invalid."""
        try:
            n = len(values)
        except TypeError:
            return "values is not a sequence"
        if names is None or names is self.joint_names or names == self.joint_names:
            if n != self.n:
                return f"expected {self.n} values, got {n}"
            try:
                out = [float(v) for v in values]
            except (TypeError, ValueError):
                return "values are not numbers"
            total = sum(out)
            if total - total == 0.0:
                return out  # all finite (a NaN or infinity, or an overflow, makes this NaN)
            isfinite = math.isfinite
            for i, val in enumerate(out):
                if not isfinite(val):
                    return f"non-finite value {val} for {self.joint_names[i]}"
            return out
        else:
            try:
                if len(names) != n:
                    return f"{len(names)} names for {n} values"
                distinct = len(set(names))
            except TypeError:
                return "names are not a sequence of strings"
            if distinct != len(names):
                return f"duplicate joint names {list(names)}"
            unknown = [nm for nm in names if nm not in self._index]
            if unknown:
                return f"unknown joints {unknown}"
            if n != self.n:
                missing = [nm for nm in self.joint_names if nm not in names]
                return f"missing joints {missing}"
            out = [0.0] * self.n
            idx = self._index
            try:
                for nm, val in zip(names, values):
                    out[idx[nm]] = float(val)
            except (TypeError, ValueError):
                return "values are not numbers"
        for i, val in enumerate(out):
            if not math.isfinite(val):
                return f"non-finite value {val} for {self.joint_names[i]}"
        return out

    def _dt(self, dt_s: float, events: list[SafetyEvent]) -> float:
        try:
            if self.dt_min_s <= dt_s <= self.dt_max_s:
                return dt_s
            dt = float(dt_s)
        except (TypeError, ValueError):
            dt = math.nan
        events.append(SafetyEvent(INVALID_INPUT, "dt", "", dt,
                                  f"dt {dt!r} s outside [{self.dt_min_s}, {self.dt_max_s}]; "
                                  f"using the nominal {self.period_s} s"))
        return self.period_s

    def _measured(self, measured: Sequence[float] | None) -> list[float] | None:
        if measured is None:
            return None
        try:
            if len(measured) != self.n:
                return None
            m = [float(v) for v in measured]
        except (TypeError, ValueError):
            return None
        return m if all(math.isfinite(v) for v in m) else None

    # -- position and velocity commands -------------------------------------------------
    def project_position(self, names: Sequence[str] | None, values: Sequence[float],
                         dt_s: float, measured: Sequence[float] | None = None) -> Projection:
        """Project a joint position command (rad); `measured` starts the trajectory if needed."""
        events: list[SafetyEvent] = []
        if self._scale_pending:
            self._settle_scale()
        if type(dt_s) is float and self.dt_min_s <= dt_s <= self.dt_max_s:
            dt = dt_s
        else:
            dt = self._dt(dt_s, events)
        if not self.initialized and not self.reset(self._measured(measured)):
            return self._uninitialized(POSITION, dt, events)
        req = self.order(names, values)
        if isinstance(req, str):
            events.append(SafetyEvent(INVALID_COMMAND, "input", "", math.nan, req))
            return self._brake_all(POSITION, dt, events, accepted=False)
        if self._core is not None:
            done = self._project_position_native(req, dt, events)
            if done is not None:
                return done
        x, v, a, joints = self.x, self.v, self.a, self.joints
        r_prev, r_prev2, synced = self._r_prev, self._r_prev2, self._synced
        n = self.n
        dt2, dt3 = dt * dt, dt * dt * dt
        gains = self._gains if dt == self._gains_dt else self._cascade_gains(dt)
        jerks, x2 = self._jerks, [0.0] * n  # x2 becomes the emitted command
        w_up, exc, levers = self._w, self._exc, self._levers
        q0 = self._fk_q
        certify = q0 is not None
        speed = tail = 0.0
        sqrt = math.sqrt
        # Everything per joint in one pass, with the helpers inlined (bit for bit the same
        # arithmetic as _request_rates, _track/sqrt_controller, _clearly_viable and the
        # per-joint bounds of _cartesian_bounds and the certification on the cached kinematics
        # of _cartesian_check): this is the control-loop path. The joints go from the tip to
        # the root, the order in which the certification sums the lever arms.
        for i in range(n - 1, -1, -1):
            jt = joints[i]
            r = req[i]
            xi, vi, ai = x[i], v[i], a[i]
            jmax, amax, vmax = jt.jmax, jt.amax, jt.vmax
            # Exact tracking when one admissible jerk lands on the request and leaves the
            # command moving like the request (else the next step could not follow): a stream
            # that respects the envelope passes unchanged. Otherwise a stable cascade catches up.
            j = (r - xi - vi * dt - ai * dt2) / dt3
            an = ai + j * dt
            vn = vi + an * dt
            exact = -jmax <= j <= jmax and -amax <= an <= amax and -vmax <= vn <= vmax
            if not exact or not synced[i]:
                # Velocity and acceleration of the request stream (zero after a reset or jump).
                r1 = r_prev[i]
                if r1 is None:
                    vr = ar = 0.0
                else:
                    vr = (r - r1) / dt
                    r2 = r_prev2[i]
                    ar = 0.0 if r2 is None else (vr - (r1 - r2) / dt) / dt
                    if not (-vmax <= vr <= vmax and -amax <= ar <= amax):
                        vr = ar = 0.0
                if exact:
                    dv = vn - vr
                    da = an - ar
                    exact = ((dv if dv >= 0.0 else -dv) <= 0.5 * jmax * dt2
                             and (da if da >= 0.0 else -da) <= 0.5 * jmax * dt)
                if not exact:
                    # The cascade of _track: position -> velocity -> acceleration.
                    gp, lin_p, two_lp, gv, lin_v, two_lv = gains[i]
                    err = r - xi - vr * dt
                    if err > lin_p:
                        c = sqrt(two_lp * (err - 0.5 * lin_p))
                    elif err < -lin_p:
                        c = -sqrt(two_lp * (-err - 0.5 * lin_p))
                    else:
                        c = err * gp
                    lim = (err if err > 0.0 else -err) / dt
                    if c > lim:
                        c = lim
                    elif c < -lim:
                        c = -lim
                    vd = vr + c
                    if vd > vmax:
                        vd = vmax
                    elif vd < -vmax:
                        vd = -vmax
                    err = vd - vi - ar * dt
                    if err > lin_v:
                        c = sqrt(two_lv * (err - 0.5 * lin_v))
                    elif err < -lin_v:
                        c = -sqrt(two_lv * (-err - 0.5 * lin_v))
                    else:
                        c = err * gv
                    lim = (err if err > 0.0 else -err) / dt
                    if c > lim:
                        c = lim
                    elif c < -lim:
                        c = -lim
                    ad = ar + c
                    if ad > amax:
                        ad = amax
                    elif ad < -amax:
                        ad = -amax
                    j = (ad - ai) / dt
            # Fast path of _viable_jerk: inside the acceleration bounds, far from both
            # position limits and slow enough that no brake can break one (_clearly_viable).
            jlo = (-amax - ai) / dt
            jhi = (amax - ai) / dt
            if jlo < -jmax:
                jlo = -jmax
            if jhi > jmax:
                jhi = jmax
            viable = False
            if jlo <= jhi:
                if j < jlo:
                    j, exact = jlo, False
                elif j > jhi:
                    j, exact = jhi, False
                if not exact:  # else an, vn above are already those of j
                    an = ai + j * dt
                    vn = vi + an * dt
                xn = xi + vn * dt
                av = vn if vn >= 0.0 else -vn
                aa = an if an >= 0.0 else -an
                w = av + aa * aa * jt.inv_2j
                e = av * aa * jt.inv_j + aa * aa * aa * jt.inv_3j2 + w * (
                    w * jt.inv_2a + jt.a_over_2j)
                viable = w <= vmax and jt.lo + e <= xn <= jt.hi - e
            if not viable:
                j = _viable_jerk(jt, xi, vi, ai, j, dt)
                an = ai + j * dt
                vn = vi + an * dt
                xn = xi + vn * dt
                av = vn if vn >= 0.0 else -vn
                aa = an if an >= 0.0 else -an
                w = av + aa * aa * jt.inv_2j
                e = av * aa * jt.inv_j + aa * aa * aa * jt.inv_3j2 + w * (
                    w * jt.inv_2a + jt.a_over_2j)
            # Braking bounds for the Cartesian check (see _cartesian_bounds).
            step = xn - xi
            if step < 0.0:
                step = -step
            if step > e:
                e = step
            exc[i] = e
            w_up[i] = w
            if certify:
                d = xn - q0[i]  # type: ignore[index]
                if d < 0.0:
                    d = -d
                lk = levers[i] + tail
                speed += lk * w
                tail += lk * (e + d)
            jerks[i] = j
            x2[i] = xn
        # The request becomes the stream history (`order` made req a fresh list).
        self._r_prev2, self._r_prev = r_prev, req
        if certify and speed <= self._speed_max and self._fk_dist - tail >= self._box_margin:
            reason = None
        else:
            reason = self._cartesian_check(x2, cached=False)
        if reason is None:
            return self._commit_exact(req, x2, dt, events, synced)
        return self._cartesian_brake(POSITION, req, jerks, dt, events, x, reason, synced)

    def _project_position_native(self, req: list[float], dt: float,
                                 events: list[SafetyEvent]) -> Projection | None:
        """The rest of `project_position` on the C core; None if the core refused the state.

        The core updates the state lists in place and returns, instead of events, per joint the
        code and amount of `_why` (or the numbers of the Cartesian event) to build them from.
        """
        try:
            out, status, deviation, fk, info = self._core.project_position(  # type: ignore
                req, dt, self.x, self.v, self.a, self._r_prev, self._r_prev2, self._synced,
                self._levers, self._fk_q, self._fk_dist)
        except (TypeError, ValueError):  # a state list of the wrong type: the Python path
            return None
        self._r_prev2, self._r_prev = self._r_prev, req
        if fk is not None:
            self._fk_q, self._fk_dist, self._last_speed, self._last_tail = fk
        if status == 0:
            if not info:
                return Projection(out, POSITION, dt, accepted=True, intervened=False,
                                  events=events, deviation=deviation)
            names = self.joint_names
            for i, code, amount in info:
                if code == 4:
                    events.append(SafetyEvent(INTERVENTION, "braking", names[i], amount,
                                              _BRAKING_DETAIL))
                else:
                    events.append(SafetyEvent(INTERVENTION, _WHY_LIMITS[code], names[i],
                                              amount))
            return Projection(out, POSITION, dt, accepted=True, intervened=True, events=events,
                              deviation=deviation)
        code, excess, px, py, pz, dist, tail, speed, speed_max = info
        if code == 0:
            events.append(SafetyEvent(INTERVENTION, "workspace", "", excess,
                                      _workspace_detail(px, py, pz, dist, tail)))
        else:
            events.append(SafetyEvent(INTERVENTION, "tool_speed", "", excess,
                                      _tool_speed_detail(speed, speed_max)))
        return Projection(out, POSITION, dt, accepted=True, intervened=True, events=events,
                          braking=True, deviation=deviation)

    def project_velocity(self, names: Sequence[str] | None, values: Sequence[float],
                         dt_s: float, measured: Sequence[float] | None = None) -> Projection:
        """Project a joint velocity command (rad/s) from the measured positions."""
        events: list[SafetyEvent] = []
        if self._scale_pending:
            self._settle_scale()
        dt = self._dt(dt_s, events)
        m = self._measured(measured)
        if not self.initialized and not self.reset(m):
            return self._uninitialized(VELOCITY, dt, events)
        # Velocity commands integrate on the arm: the position reference is the measured one
        # (or, without a valid measurement, the projector's own prediction).
        base = m if m is not None else self.x
        req = self.order(names, values)
        if isinstance(req, str):
            events.append(SafetyEvent(INVALID_COMMAND, "input", "", math.nan, req))
            return self._brake_all(VELOCITY, dt, events, accepted=False, x_base=base)
        v, a, joints = self.v, self.a, self.joints
        n = self.n
        jerks, x2, v2, a2 = [0.0] * n, [0.0] * n, [0.0] * n, [0.0] * n
        for i in range(n):
            jt = joints[i]
            jd = ((req[i] - v[i]) / dt - a[i]) / dt
            if not (-jt.jmax <= jd <= jt.jmax and -jt.amax <= a[i] + jd * dt <= jt.amax):
                ad = sqrt_controller(req[i] - v[i], _VEL_GAIN / dt, jt.jmax * _LIMIT_SHARE, dt)
                jd = (ad - a[i]) / dt
            j = _viable_jerk(jt, base[i], v[i], a[i], jd, dt)
            an = a[i] + j * dt
            vn = v[i] + an * dt
            jerks[i], a2[i], v2[i], x2[i] = j, an, vn, base[i] + vn * dt
        return self._finish(VELOCITY, req, jerks, dt, events, base, x2, v2, a2)

    def brake(self, dt_s: float, mode: str = POSITION,
              measured: Sequence[float] | None = None) -> Projection:
        """Stop every joint as hard as the limits allow and hold (hold, fallback, e-stop)."""
        events: list[SafetyEvent] = []
        if self._scale_pending:
            self._settle_scale()
        dt = self._dt(dt_s, events)
        m = self._measured(measured)
        if not self.initialized and not self.reset(m):
            return self._uninitialized(mode, dt, events)
        base = m if (mode == VELOCITY and m is not None) else self.x
        return self._brake_all(mode, dt, events, accepted=True, x_base=base)

    def _uninitialized(self, mode: str, dt: float, events: list[SafetyEvent]) -> Projection:
        events.append(SafetyEvent(INVALID_INPUT, "measured_state", "", math.nan,
                                  "no valid measured state to start the command trajectory"))
        return Projection([], mode, dt, accepted=False, intervened=True, events=events,
                          braking=True)

    def _brake_all(self, mode: str, dt: float, events: list[SafetyEvent], accepted: bool,
                   x_base: list[float] | None = None) -> Projection:
        base = x_base if x_base is not None else self.x
        proj = self._commit(mode, self._brake_jerks(dt, base), dt, base)
        return Projection(proj, mode, dt, accepted=accepted, intervened=True, events=events,
                          braking=True, deviation=math.inf)

    def _request_rates(self, i: int, jt: _Joint, r: float, dt: float) -> tuple[float, float]:
        """Velocity and acceleration of the request stream (zero after a reset or a jump).

        Reference form: `project_position` inlines this (test_safety_projection_fast.py holds
        the two to the same bits); nothing else calls it.
        """
        r1, r2 = self._r_prev[i], self._r_prev2[i]
        if r1 is None:
            return 0.0, 0.0
        vr = (r - r1) / dt
        ar = 0.0 if r2 is None else (vr - (r1 - r2) / dt) / dt
        if not (-jt.vmax <= vr <= jt.vmax and -jt.amax <= ar <= jt.amax):
            return 0.0, 0.0
        return vr, ar

    def _track(self, jt: _Joint, r: float, vr: float, ar: float, x: float, v: float, a: float,
               dt: float) -> float:
        """Jerk of a stable cascade (position -> velocity -> acceleration) towards a request.

        Reference form of the cascade `project_position` inlines (held to the same bits by
        test_safety_projection_fast.py); nothing else calls it.
        """
        # The request's own velocity and acceleration are fed forward and the errors are taken
        # after the feed-forward step, so on a tracked stream both errors are zero.
        vd = vr + sqrt_controller(r - x - vr * dt, _POS_GAIN / dt, jt.amax * _LIMIT_SHARE, dt)
        vd = min(max(vd, -jt.vmax), jt.vmax)
        ad = ar + sqrt_controller(vd - v - ar * dt, _VEL_GAIN / dt, jt.jmax * _LIMIT_SHARE, dt)
        ad = min(max(ad, -jt.amax), jt.amax)
        return (ad - a) / dt

    def _cascade_gains(self, dt: float) -> list[tuple[float, float, float, float, float, float]]:
        """Per joint, the constants of the two sqrt_controller stages of _track for this dt."""
        out = []
        for jt in self.joints:
            gp, lp = _POS_GAIN / dt, jt.amax * _LIMIT_SHARE
            gv, lv = _VEL_GAIN / dt, jt.jmax * _LIMIT_SHARE
            out.append((gp, lp / (gp * gp), 2.0 * lp, gv, lv / (gv * gv), 2.0 * lv))
        self._gains, self._gains_dt = out, dt
        return out

    def _brake_jerks(self, dt: float, x_base: list[float]) -> list[float]:
        """Per joint, the hardest stop that still keeps the joint's own limits satisfiable."""
        out = [0.0] * self.n
        self._brake_into(dt, x_base, out, False)
        return out

    def _brake_into(self, dt: float, x_base: list[float], out: list[float],
                    bounds: bool) -> tuple[float, float]:
        """Fill `out` with the brake jerks; with `bounds`, also return `_trial_bounds(0.0)`.

        `_viable_jerk(_brake_jerk(...))` per joint, with both inlined up to the fast viability
        test; the exact (slower) viability search runs only where that test is inconclusive.
        The joints go from the tip to the root, so the tool speed bound and braking travel of
        the brake (on the cached kinematics, as `_trial_bounds` computes them for share 0)
        come out of the same pass.
        """
        v, a, joints = self.v, self.a, self.joints
        levers, q0 = self._levers, self._fk_q
        speed = tail = 0.0
        for i in range(self.n - 1, -1, -1):
            jt = joints[i]
            vi, ai, xi = v[i], a[i], x_base[i]
            jmax, amax = jt.jmax, jt.amax
            jlo = (-amax - ai) / dt
            jhi = (amax - ai) / dt
            if jlo < -jmax:
                jlo = -jmax
            if jhi > jmax:
                jhi = jmax
            if jlo > jhi:
                j = -jmax if ai > 0.0 else jmax
                viable = False
            else:
                # _brake_jerk: settle exactly in two steps when close to rest, else stop hard.
                if ((vi if vi >= 0.0 else -vi) <= 0.5 * jmax * dt * dt
                        and (ai if ai >= 0.0 else -ai) <= 0.5 * jmax * dt):
                    j = (-vi / dt - ai) / dt
                else:
                    s = 1.0 if (vi > 0.0 or (vi == 0.0 and ai > 0.0)) else -1.0
                    vs, as_ = s * vi, s * ai
                    if as_ < 0.0 and as_ * as_ >= 2.0 * jmax * vs:
                        jm = as_ * as_ / (2.0 * vs) if vs > 0.0 else jmax
                    elif as_ <= -amax:
                        jm = 0.0
                    else:
                        jm = -jmax
                    j = _endgame_jerk(vi, ai, s * (jm if jm < jmax else jmax), jmax, dt)
                if j < jlo:
                    j = jlo
                elif j > jhi:
                    j = jhi
                an = ai + j * dt
                vn = vi + an * dt
                xn = xi + vn * dt
                av = vn if vn >= 0.0 else -vn
                aa = an if an >= 0.0 else -an
                w = av + aa * aa * jt.inv_2j
                e = av * aa * jt.inv_j + aa * aa * aa * jt.inv_3j2 + w * (
                    w * jt.inv_2a + jt.a_over_2j)
                viable = w <= jt.vmax and jt.lo + e <= xn <= jt.hi - e
            if not viable:
                j = _viable_jerk(jt, xi, vi, ai, j, dt)
                an = ai + j * dt
                vn = vi + an * dt
                xn = xi + vn * dt
                av = vn if vn >= 0.0 else -vn
                aa = an if an >= 0.0 else -an
                w = av + aa * aa * jt.inv_2j
                e = av * aa * jt.inv_j + aa * aa * aa * jt.inv_3j2 + w * (
                    w * jt.inv_2a + jt.a_over_2j)
            out[i] = j
            if bounds:
                step = xn - xi
                if step < 0.0:
                    step = -step
                if step > e:
                    e = step
                d = xn - q0[i]  # type: ignore[index]
                if d < 0.0:
                    d = -d
                lk = levers[i] + tail
                speed += lk * w
                tail += lk * (e + d)
        return speed, tail

    def _finish(self, mode: str, req: list[float], jerks: list[float], dt: float,
                events: list[SafetyEvent], x_base: list[float], x2: list[float],
                v2: list[float], a2: list[float]) -> Projection:
        """Check the Cartesian limits for the candidate (x2, v2, a2), commit it or brake."""
        self._cartesian_bounds(x_base, x2, v2, a2)
        reason = self._cartesian_check(x2)
        if reason is not None:
            return self._cartesian_brake(mode, req, jerks, dt, events, x_base, reason)
        if mode == POSITION:
            return self._commit_exact(req, x2, dt, events)
        # x_base may be the state list itself, which _commit updates in place.
        x_prev, v_prev, a_prev = list(x_base), list(self.v), list(self.a)
        out = self._commit(mode, jerks, dt, x_base, req)
        intervened = False
        deviation = 0.0
        for i in range(self.n):
            d = abs(out[i] - req[i])
            if d > _TOL_ABS * (1.0 + abs(req[i])):
                intervened = True
                if d > deviation:
                    deviation = d
                events.append(self._why(i, req[i], out[i], x_prev[i], v_prev[i],
                                        a_prev[i], mode, dt))
        return Projection(out, mode, dt, accepted=True, intervened=intervened, events=events,
                          deviation=deviation)

    def _cartesian_brake(self, mode: str, req: list[float], jerks: list[float], dt: float,
                         events: list[SafetyEvent], x_base: list[float],
                         reason: tuple[str, float, str],
                         synced: list[bool] | None = None) -> Projection:
        """The candidate failed the Cartesian check: blend it towards the brake and commit.

        Keeps as much of the request as the Cartesian limits allow (a full brake when nothing
        else passes); every joint brakes, so the event names the Cartesian limit, not a joint.
        With `synced`, also record per joint whether the emitted command is the request.
        """
        limit, excess, detail = reason
        events.append(SafetyEvent(INTERVENTION, limit, "", excess, detail))
        n = self.n
        brake = [0.0] * n
        speed0, tail0 = self._brake_into(dt, x_base, brake, True)
        share = self._blend_share(brake, jerks, dt, x_base, speed0, tail0)
        # Apply brake + share * (request - brake) exactly as _trial_bounds evaluated it, keep
        # the state equal to the finite differences of what is emitted (as in _commit).
        x, v, a = self.x, self.v, self.a
        out = [0.0] * n
        velocity = mode == VELOCITY
        deviation = 0.0
        for i in range(n):
            b = brake[i]
            ai = a[i] + (b + share * (jerks[i] - b)) * dt
            vi = v[i] + ai * dt
            xi = x_base[i] + vi * dt
            if velocity:
                out[i] = o = vi
                x[i] = xi
                a[i] = (vi - v[i]) / dt
                v[i] = vi
            else:
                out[i] = o = xi
                vn = (xi - x[i]) / dt
                a[i] = (vn - v[i]) / dt
                v[i] = vn
                x[i] = xi
            r = req[i]
            d = o - r
            if d < 0.0:
                d = -d
            beyond = d > _TOL_ABS * (1.0 + (r if r >= 0.0 else -r))
            if beyond and d > deviation:
                deviation = d
            if synced is not None:
                synced[i] = not beyond
        # Braking always intervenes; `deviation` is the largest change beyond rounding.
        return Projection(out, mode, dt, accepted=True, intervened=True, events=events,
                          braking=True, deviation=deviation)

    def _blend_share(self, brake: list[float], jerks: list[float], dt: float,
                     x_base: list[float], speed0: float, tail0: float) -> float:
        """Largest share s found of the request in the jerks brake + s (request - brake) that
        passes the Cartesian check; 0.0 (the full brake) when none does.

        Called right after the candidate (s = 1) failed the check on the kinematics evaluated
        at it; each trial share is checked with those lever arms and box distance plus the
        joint motion since (`_trial_bounds`, the certification of `_cartesian_check`: a valid
        bound, no further kinematics), so whatever share is returned passed that check. The
        search is regula falsi on the two constraint margins (tool speed, box) from the brake
        (s = 0) and the candidate: the margins are close to linear in s, so the first
        interpolated share usually passes. `speed0`, `tail0`: the bounds of the brake (share
        0, from `_brake_into`); at most _CARTESIAN_STEPS - 1 further trials.
        """
        speed_max, margin, dist = self._speed_max, self._box_margin, self._fk_dist
        hi_s, hi_b = self._last_speed - speed_max, self._last_tail + margin - dist
        lo_s, lo_b = speed0 - speed_max, tail0 + margin - dist  # the brake, share 0
        if lo_s > 0.0 or lo_b > 0.0:
            return 0.0
        lo, hi = 0.0, 1.0
        for _ in range(_CARTESIAN_STEPS - 1):
            share = _regula_falsi(lo, lo_s, lo_b, hi, hi_s, hi_b)
            if not lo < share < hi:
                break
            speed, tail = self._trial_bounds(share, brake, jerks, dt, x_base)
            g_s, g_b = speed - speed_max, tail + margin - dist
            if g_s <= 0.0 and g_b <= 0.0:
                return share
            hi, hi_s, hi_b = share, g_s, g_b
        return lo

    def _trial_bounds(self, share: float, brake: list[float], jerks: list[float], dt: float,
                      x_base: list[float]) -> tuple[float, float]:
        """Tool speed bound and braking travel of a blended trial on the cached kinematics.

        The same bounds as the certification in `_cartesian_check` for the state the jerks
        brake + share * (jerks - brake) lead to (computed exactly as `_commit` applies them).
        """
        joints, levers, q0 = self.joints, self._levers, self._fk_q
        v, a = self.v, self.a
        assert q0 is not None
        speed = tail = 0.0
        for k in range(self.n - 1, -1, -1):
            jt = joints[k]
            b = brake[k]
            ak = a[k] + (b + share * (jerks[k] - b)) * dt
            vk = v[k] + ak * dt
            xb = x_base[k]
            xk = xb + vk * dt
            av = vk if vk >= 0.0 else -vk
            aa = ak if ak >= 0.0 else -ak
            w = av + aa * aa * jt.inv_2j
            e = av * aa * jt.inv_j + aa * aa * aa * jt.inv_3j2 + w * (
                w * jt.inv_2a + jt.a_over_2j)
            step = xk - xb
            if step < 0.0:
                step = -step
            if step > e:
                e = step
            d = xk - q0[k]
            if d < 0.0:
                d = -d
            lk = levers[k] + tail
            speed += lk * w
            tail += lk * (e + d)
        return speed, tail

    def _commit_exact(self, req: list[float], x2: list[float], dt: float,
                      events: list[SafetyEvent], synced: list[bool] | None = None) -> Projection:
        """Commit a position candidate that passed every check (the hot path).

        With `synced`, also record per joint whether the emitted command is the request.
        """
        x, v, a = self.x, self.v, self.a
        out = x2
        deviation = 0.0
        intervened = False
        why: list[tuple[int, float, float, float]] = []
        for i in range(self.n):
            xi = x2[i]
            r = req[i]
            d = xi - r if xi > r else r - xi
            tracked = True
            if d:
                scale = 1.0 + (r if r > 0.0 else -r)
                if d <= _SNAP * scale:
                    # Float rounding of the update, not an intervention: emit the request.
                    xi = out[i] = r
                elif d > _TOL_ABS * scale:
                    intervened = True
                    tracked = False
                    why.append((i, x[i], v[i], a[i]))
                    if d > deviation:
                        deviation = d
            if synced is not None:
                synced[i] = tracked
            xo, vo = x[i], v[i]
            vn = (xi - xo) / dt
            a[i] = (vn - vo) / dt
            v[i] = vn
            x[i] = xi
        for i, xo, vo, ao in why:
            events.append(self._why(i, req[i], out[i], xo, vo, ao, POSITION, dt))
        return Projection(out, POSITION, dt, accepted=True, intervened=intervened,
                          events=events, deviation=deviation)

    def _commit(self, mode: str, jerks: list[float], dt: float, x_base: list[float],
                req: list[float] | None = None) -> list[float]:
        """Apply jerks; keep the state equal to the finite differences of what is emitted.

        With `req`, a result that differs from the request only by float rounding emits the
        request itself, so a stream inside the envelope passes bit for bit.
        """
        x, v, a = self.x, self.v, self.a
        out = [0.0] * self.n
        for i in range(self.n):
            ai = a[i] + jerks[i] * dt
            vi = v[i] + ai * dt
            xi = x_base[i] + vi * dt
            if req is not None:
                r = req[i]
                if r != xi and abs(r - xi) <= _SNAP * (1.0 + abs(r)):
                    if mode == VELOCITY:
                        vi = r
                        xi = x_base[i] + vi * dt
                    else:
                        xi = r
            if mode == VELOCITY:
                out[i] = vi
                x[i] = xi
                a[i] = (vi - v[i]) / dt
                v[i] = vi
            else:
                out[i] = xi
                vn = (xi - x[i]) / dt
                a[i] = (vn - v[i]) / dt
                v[i] = vn
                x[i] = xi
        return out

    def _cartesian_bounds(self, x1: list[float], x2: list[float], v2: list[float],
                          a2: list[float]) -> None:
        """Fill the per-joint braking bounds of the candidate (x2, v2, a2) from x1.

        Closed-form upper bounds: w = |v| + a^2/(2J) (the speed reached while the
        acceleration ramps to zero) and E = the jerk-limited stop from w plus the ramp, at
        least the step just taken; `drift` is the motion since the cached kinematics.
        """
        joints = self.joints
        q0 = self._fk_q
        exc, w, drift = self._exc, self._w, self._drift
        for i in range(self.n):
            jt = joints[i]
            vi = v2[i]
            if vi < 0.0:
                vi = -vi
            ai = a2[i]
            if ai < 0.0:
                ai = -ai
            wi = vi + ai * ai * jt.inv_2j
            e = vi * ai * jt.inv_j + ai * ai * ai * jt.inv_3j2 + wi * (
                wi * jt.inv_2a + jt.a_over_2j)
            step = x2[i] - x1[i]
            if step < 0.0:
                step = -step
            exc[i] = e if e > step else step
            w[i] = wi
            if q0 is not None:
                d = x2[i] - q0[i]
                drift[i] = d if d > 0.0 else -d

    def _cartesian_check(self, x2: list[float],
                         cached: bool = True) -> tuple[str, float, str] | None:
        """Check the candidate x2 whose braking bounds `_cartesian_bounds` filled in.

        Both limits keep a braking reserve. Let E_i bound how far joint i may still travel (its
        braking distance) and w_i the largest speed it reaches while braking. Rotating joint i
        by E_i moves the tool by at most L_i * E_i, where L_i is i's lever arm (distance from
        its axis to the tool) now plus what the joints after it can add while braking:
        L_k = r_k + sum_{i>k} L_i * E_i, with r_k exact from the kinematics. The tool stays in
        the box if it is sum_k L_k * E_k inside it, and its speed stays below sum_k L_k * w_k.
        A first pass reuses the lever arms and box distance of the last kinematics evaluation
        (adding the joint motion since then to E); only if that cannot certify the candidate
        are the kinematics evaluated at the candidate. A failed check always leaves the
        kinematics of the candidate cached, with its bounds in `_last_speed`/`_last_tail`.
        `cached=False`: the caller already tried the first pass.
        """
        n = self.n
        speed_max = self._speed_max
        exc, w, levers = self._exc, self._w, self._levers
        if cached and self._fk_q is not None:
            # Certify with the last kinematics: the joints moved `drift` since then.
            drift = self._drift
            speed = tail = 0.0
            for k in range(n - 1, -1, -1):
                lk = levers[k] + tail
                speed += lk * w[k]
                tail += lk * (exc[k] + drift[k])
            if speed <= speed_max and self._fk_dist - tail >= self._box_margin:
                return None
        px, py, pz = self._fk(x2, levers)
        lo, hi = self._box_lo, self._box_hi
        dist = min(px - lo[0], hi[0] - px, py - lo[1], hi[1] - py, pz - lo[2], hi[2] - pz)
        self._fk_q = list(x2)
        self._fk_dist = dist
        speed = tail = 0.0
        for k in range(n - 1, -1, -1):
            lk = levers[k] + tail
            speed += lk * w[k]
            tail += lk * exc[k]
        self._last_speed, self._last_tail = speed, tail
        if dist < tail + self._box_margin:
            return ("workspace", tail + self._box_margin - dist,
                    _workspace_detail(px, py, pz, dist, tail))
        if speed > speed_max:
            return ("tool_speed", speed - speed_max, _tool_speed_detail(speed, speed_max))
        return None

    def _why(self, i: int, req: float, out: float, x_prev: float, v_prev: float,
             a_prev: float, mode: str, dt: float) -> SafetyEvent:
        """Name the first limit (position, velocity, acceleration, jerk) a request broke."""
        jt = self.joints[i]
        name = self.joint_names[i]
        if mode == POSITION:
            if req > jt.env_hi:
                return SafetyEvent(INTERVENTION, "position", name, req - jt.env_hi)
            if req < jt.env_lo:
                return SafetyEvent(INTERVENTION, "position", name, jt.env_lo - req)
            v_req = (req - x_prev) / dt
        else:
            v_req = req
        if abs(v_req) > jt.vmax:
            return SafetyEvent(INTERVENTION, "velocity", name, abs(v_req) - jt.vmax)
        a_req = (v_req - v_prev) / dt
        if abs(a_req) > jt.amax:
            return SafetyEvent(INTERVENTION, "acceleration", name, abs(a_req) - jt.amax)
        j_req = (a_req - a_prev) / dt
        if abs(j_req) > jt.jmax:
            return SafetyEvent(INTERVENTION, "jerk", name, abs(j_req) - jt.jmax)
        return SafetyEvent(INTERVENTION, "braking", name, abs(out - req), _BRAKING_DETAIL)

    # -- effort and wrench commands -------------------------------------------------------
    def project_effort(self, names: Sequence[str] | None, values: Sequence[float],
                       measured: Sequence[float] | None = None,
                       measured_velocity: Sequence[float] | None = None) -> Projection:
        """Clip joint torques (N·m) to the effort limits; no torque pushes a joint further out."""
        events: list[SafetyEvent] = []
        req = self.order(names, values)
        q = self._measured(measured)
        if isinstance(req, str):
            events.append(SafetyEvent(INVALID_COMMAND, "input", "", math.nan, req))
            return self.effort_hold(measured, measured_velocity, events)
        out = [0.0] * self.n
        intervened = False
        for i, jt in enumerate(self.joints):
            t = req[i]
            lim = jt.effort
            if t > lim or t < -lim:
                c = lim if t > 0 else -lim
                events.append(SafetyEvent(INTERVENTION, "effort", jt.name, abs(t) - lim))
                t = c
                intervened = True
            if q is not None and ((q[i] >= jt.env_hi and t > 0.0)
                                  or (q[i] <= jt.env_lo and t < 0.0)):
                events.append(SafetyEvent(INTERVENTION, "position", jt.name, abs(t),
                                          "torque pushing a joint past its position limit"))
                t = 0.0
                intervened = True
            out[i] = t
        self.last_effort = out
        deviation = max(abs(o - r) for o, r in zip(out, req))
        return Projection(out, EFFORT, self.period_s, accepted=True, intervened=intervened,
                          events=events, deviation=deviation)

    def effort_hold(self, measured: Sequence[float] | None,
                    measured_velocity: Sequence[float] | None,
                    events: list[SafetyEvent] | None = None) -> Projection:
        """Torques that hold the last position command (PD), clipped to the effort limits."""
        events = events if events is not None else []
        q = self._measured(measured)
        qd = self._measured(measured_velocity)
        out = [0.0] * self.n
        if q is not None:
            if not self.initialized:
                self.reset(q)
            for i, jt in enumerate(self.joints):
                t = self.effort_hold_kp[i] * (self.x[i] - q[i])
                if qd is not None:
                    t -= self.effort_hold_kd[i] * qd[i]
                out[i] = min(max(t, -jt.effort), jt.effort)
        self.last_effort = out
        return Projection(out, EFFORT, self.period_s, accepted=False, intervened=True,
                          events=events, braking=True)

    def project_wrench(self, values: Sequence[float]) -> WrenchProjection:
        """Clip a commanded wrench [fx, fy, fz, tx, ty, tz] per axis and by norm."""
        events: list[SafetyEvent] = []
        try:
            w = [float(v) for v in values]
        except (TypeError, ValueError):
            w = []
        if len(w) != 6 or not all(math.isfinite(v) for v in w):
            events.append(SafetyEvent(INVALID_COMMAND, "wrench", "", math.nan,
                                      f"wrench must be 6 finite numbers, got {list(values)!r}"
                                      if isinstance(values, (list, tuple)) else "bad wrench"))
            return WrenchProjection([0.0] * 6, accepted=False, intervened=True, events=events)
        lim = self.commanded
        out = list(w)
        intervened = False
        per_axis = (*lim.max_force_per_axis_n, *lim.max_torque_per_axis_nm)
        labels = ("force_x", "force_y", "force_z", "torque_x", "torque_y", "torque_z")
        for k in range(6):
            m = per_axis[k]
            if abs(out[k]) > m:
                events.append(SafetyEvent(INTERVENTION, f"wrench_{labels[k]}", "",
                                          abs(out[k]) - m))
                out[k] = m if out[k] > 0 else -m
                intervened = True
        for sl, m, label in ((slice(0, 3), lim.max_force_n, "wrench_force_norm"),
                             (slice(3, 6), lim.max_torque_nm, "wrench_torque_norm")):
            part = out[sl]
            norm = math.sqrt(sum(c * c for c in part))
            if norm > m:
                events.append(SafetyEvent(INTERVENTION, label, "", norm - m))
                f = m / norm * (1.0 - _SHRINK)
                out[sl] = [c * f for c in part]
                intervened = True
        return WrenchProjection(out, accepted=True, intervened=intervened, events=events)
