"""The effort regression: joint losses, rotor inertia and masses from the efforts a drive reports.

With the plant's inverse dynamics, tau = M(q) q̈ + h(q, q̇) + b q̇ + F sign(q̇) is linear in
the mass scale, mass x inertia scale, payload mass, armature, damping and friction, so one linear
least-squares solve estimates them without modelling the drive's control law. Whether its
answers are the unit's depends on three things this module handles:

- **When the effort was sampled.** Positions and velocities are samples at the stamp; a drive
  that reports its mean torque over the reporting period (the proxy, or a current sensor that
  integrates) reports it half a period earlier, and a filtered current lags by its filter. At
  125 Hz a 4 ms lag reads as damping (+38 % on the shoulder in the proxy study,
  bench/study_excitation_recovery.py). `estimate_effort_lag` finds the lag that minimises the
  regression's residual (a grid over 1.5 sample periods, refined by a parabola) and
  `align_effort` shifts the efforts onto the stamps by it.
- **Nuisance parameters the physics must not absorb.** The encoder offset of each joint (a
  homing offset: the gravity model is evaluated at the measured angles, and 6 mrad on the
  shoulder moved its damping by +15 % and the payload by +5 points) and the payload's centre of
  mass (its first moments m·c enter the inverse dynamics linearly; a 2 cm offset from the tool
  flange read as +14 % armature on the wrists). Both are estimated alongside (`nuisance`) and
  reported; the payload's centre of mass is the simulator's `payload_offset_m`.
- **Rows near zero velocity are left out** (|q̇| < `MIN_SPEED_RAD_S`): dry friction there is
  not F sign(q̇) of the sampled velocity (stiction; in MuJoCo, the friction constraint's sign
  lags a reversal by several steps), so those rows bias friction and damping.

Pure numpy and the plant's inverse dynamics; no ROS.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from sim2real_ros.sim.plant import ArmPlant, PlantParams
from sim2real_ros.sysid.runs import RunData

# The effort regression's low-pass: a cubic Savitzky-Golay window of at least this long and at
# least this many samples. The drive's torque under a 100 Hz command staircase is sampled at the
# joint-state rate; at 125 Hz the staircase aliases to 25 Hz, which the former 40 ms window (5
# samples there) passed: the regression then read armature at its bound and damping off by up to
# 3x (bench/study_excitation_recovery.py). 15 samples put the alias in the stop band at 125 Hz;
# 80 ms keep a 500 Hz stream's window as wide. Excitations stay below ~2 Hz, well inside the
# pass band.
SAVGOL_MIN_S = 0.08
SAVGOL_MIN_SAMPLES = 15
# Rows slower than this (rad/s, per joint) are not used: dry friction is not F sign(q̇) there.
MIN_SPEED_RAD_S = 0.1
# Samples the regression uses at most (drawn at random beyond). Three 24 s runs at 125 Hz are
# 9000: with 4000 of them the shoulder-pan damping (no gravity, the smallest signal) moved by
# 10 points from one draw to the next in the proxy study; all of them cost ~2 s.
MAX_ROWS = 12000
# Finite-difference steps of the nuisance columns (central differences: the payload's inverse
# dynamics is quadratic in its offset, so the central difference is its exact linear part).
_PAYLOAD_STEP_M = 0.05
_OFFSET_STEP_RAD = 1e-3
# An encoder-offset column is used only where gravity makes it matter: a 10 mrad offset must
# move some joint's torque by at least this much (N·m) at some sampled pose.
_OFFSET_MIN_EFFECT_NM = 0.1
# Zero-mean Gaussian priors of the nuisance parameters (a ridge whose weight is the residual of
# the solve without them over the prior's sigma): where the data determine them the prior does
# not matter; on short or noisy runs it keeps them from absorbing noise into wild values.
OFFSET_PRIOR_RAD = 0.005  # homing offsets of a few mrad
MOMENT_PRIOR_KGM = 0.05  # payload first moment m·c, e.g. 0.5 kg 10 cm off the flange
AXES = ("x", "y", "z")
PHYSICS_GROUPS = ("joint_damping_nms", "joint_friction_nm", "armature_kgm2", "mass_scale",
                  "inertia_scale", "payload_kg")


def savgol(x: np.ndarray, dt_s: float, deriv: int = 0) -> np.ndarray:
    """Zero-phase Savitzky-Golay low-pass (cubic, >= 80 ms and >= 15 samples) along time."""
    from scipy.signal import savgol_filter

    win = max(SAVGOL_MIN_SAMPLES, int(round(SAVGOL_MIN_S / dt_s))) | 1
    if x.shape[0] <= win:
        return np.gradient(x, dt_s, axis=0) if deriv else x.copy()
    return savgol_filter(x, win, 3, deriv=deriv, delta=dt_s, axis=0)


def sample_rows(lo: int, hi: int, stride: float, seed: int) -> np.ndarray:
    """Return about (hi - lo) / stride sorted sample indices in [lo, hi), drawn at random.

    Not every stride-th sample: a stride that is a multiple of the command period in samples
    (5 at 500 Hz sampling of 100 Hz commands; 3 x 20 s runs against 1500 rows give 15) sees
    every command step at the same phase, and the efforts of a drive fed a staircase then alias
    into a constant offset that the regressions read as latency, damping or inertia.
    """
    count = hi - lo
    if count <= 0:
        return np.zeros(0, dtype=int)
    if stride <= 1.0:
        return np.arange(lo, hi)
    m = max(1, int(round(count / stride)))
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(np.arange(lo, hi), size=min(m, count), replace=False))


def align_effort(runs: list[RunData], lag_s: float) -> list[RunData]:
    """Return the runs with each effort moved onto the stamp it describes: tau(t) := tau(t + lag).

    The last `lag_s` of each run, which has no later sample, keeps the last effort.
    """
    if not math.isfinite(lag_s) or lag_s < 0.0:
        raise ValueError(f"effort lag {lag_s!r} s: expected a finite number >= 0")
    if lag_s == 0.0:
        return list(runs)
    out = []
    for r in runs:
        if r.tau is None:
            out.append(r)
            continue
        t = r.t_s + lag_s
        tau = np.column_stack([np.interp(t, r.t_s, r.tau[:, j]) for j in range(r.tau.shape[1])])
        out.append(dataclasses.replace(r, tau=tau))
    return out


@dataclass
class RegressionResult:
    """One solve of the effort regression."""

    values: dict[str, float]  # physics, named as the fit's parameters ('armature_kgm2[2]', ...)
    nuisance: dict[str, float]  # 'joint_offset_rad[k]' (measured - true), 'payload_com_m[x]'
    rows: int
    residual_rms_nm: float | None
    lag_s: float = 0.0


@dataclass
class LagScan:
    """The effort lag that minimises the regression's residual, and the residual per lag."""

    lag_s: float
    lags_s: list[float] = field(default_factory=list)
    residual_rms_nm: list[float] = field(default_factory=list)


class EffortRegression:
    """The regression's design for a set of runs: sampled rows and inverse-dynamics columns.

    Built once (the inverse dynamics dominates the cost); `solve` then takes the free groups and
    the effort lag, so a lag scan re-reads only the efforts.
    """

    def __init__(self, plant: ArmPlant, runs: list[RunData], base: PlantParams,
                 max_rows: int = MAX_ROWS, min_speed_rad_s: float = MIN_SPEED_RAD_S,
                 nuisance: bool = True) -> None:
        self.n = plant.n
        self.min_speed_rad_s = float(min_speed_rad_s)
        self.base = plant.resolved_params(base)
        self.available = bool(runs) and all(r.tau is not None for r in runs)
        self.runs = runs
        self._samples: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        self._tau_f: list[np.ndarray] = []
        if not self.available:
            return
        total = sum(r.t_s.size for r in runs)
        stride = max(1.0, total / max_rows)
        for i, r in enumerate(runs):
            assert r.tau is not None
            period = r.sample_period_s
            self._tau_f.append(savgol(r.tau, period))
            qd_f = savgol(r.qd, period)
            qdd_f = savgol(r.qd, period, deriv=1)
            k = sample_rows(10, r.t_s.size - 10, stride, seed=i)
            self._samples.append((k, r.q[k], qd_f[k], qdd_f[k]))

        zero_arm = self.base.copy()
        zero_arm.armature_kgm2 = np.zeros(self.n)
        zero_arm.mass_scale, zero_arm.inertia_scale, zero_arm.payload_kg = 1.0, 1.0, 0.0
        id0 = self._id_all(plant, zero_arm)
        p1 = zero_arm.copy()
        p1.inertia_scale = 2.0
        id1 = self._id_all(plant, p1)
        p2 = zero_arm.copy()
        p2.payload_kg = 1.0
        id2 = self._id_all(plant, p2)
        self.mass_part = [2 * a - b for a, b in zip(id0, id1)]
        self.rot_part = [b - a for a, b in zip(id0, id1)]
        self.pay_part = [c - a for a, c in zip(id0, id2)]
        # Nuisance columns: the payload's first moments (per kg·m) and the encoder offsets.
        self.moment_parts: dict[str, list[np.ndarray]] = {}
        self.offset_parts: dict[int, list[np.ndarray]] = {}
        if nuisance:
            for a, axis in enumerate(AXES):
                plus, minus = p2.copy(), p2.copy()
                plus.payload_offset_m = p2.payload_offset_m + _PAYLOAD_STEP_M * np.eye(3)[a]
                minus.payload_offset_m = p2.payload_offset_m - _PAYLOAD_STEP_M * np.eye(3)[a]
                hi, lo = self._id_all(plant, plus), self._id_all(plant, minus)
                self.moment_parts[axis] = [(h - m) / (2 * _PAYLOAD_STEP_M)
                                           for h, m in zip(hi, lo)]
            for k in range(self.n):
                step = _OFFSET_STEP_RAD * np.eye(self.n)[k]
                hi = self._id_all(plant, self.base, dq=step)
                lo = self._id_all(plant, self.base, dq=-step)
                # tau = ID(q_measured - offset): the column of the offset is -dID/dq_k.
                part = [-(h - m) / (2 * _OFFSET_STEP_RAD) for h, m in zip(hi, lo)]
                if max(float(np.abs(p).max(initial=0.0)) for p in part) * 0.01 \
                        >= _OFFSET_MIN_EFFECT_NM:
                    self.offset_parts[k] = part
        plant.set_params(self.base)

    def _id_all(self, plant: ArmPlant, p: PlantParams, dq: np.ndarray | None = None
                ) -> list[np.ndarray]:
        plant.set_params(p)
        out = []
        for _, q, qd, qdd in self._samples:
            qq = q if dq is None else q + dq
            out.append(np.array([plant.inverse_dynamics(a, b, c)
                                 for a, b, c in zip(qq, qd, qdd)]))
        return out

    def efforts(self, lag_s: float = 0.0) -> list[np.ndarray]:
        """The low-passed efforts at the sampled rows, each read `lag_s` after its stamp."""
        out = []
        for r, tau_f, (k, *_rest) in zip(self.runs, self._tau_f, self._samples):
            if lag_s == 0.0:
                out.append(tau_f[k])
            else:
                t = r.t_s[k] + lag_s
                out.append(np.column_stack([np.interp(t, r.t_s, tau_f[:, j])
                                            for j in range(self.n)]))
        return out

    def solve(self, groups: tuple[str, ...], lag_s: float = 0.0,
              bounds: Mapping[str, tuple[float, float]] | None = None) -> RegressionResult:
        """Least squares of the free `groups` (the rest at the base values); `bounds` per group
        ('mass_scale', 'armature_kgm2', ...) make it a bounded solve, else unbounded."""
        if not self.available:
            return RegressionResult({}, {}, 0, None, lag_s)
        n, base = self.n, self.base
        free = set(groups)
        mass_f, inertia_f, payload_f = (g in free for g in ("mass_scale", "inertia_scale",
                                                            "payload_kg"))
        sm, si = base.mass_scale, base.inertia_scale
        arm_b = np.asarray(base.armature_kgm2)
        damp_b = np.asarray(base.joint_damping_nms)
        fric_b = np.asarray(base.joint_friction_nm)
        cols: list[str] = []
        blocks_all: list[tuple[dict[str, np.ndarray], np.ndarray]] = []
        for s, ((_, _q, qd, qdd), tau) in enumerate(zip(self._samples, self.efforts(lag_s))):
            mass_part, rot_part, pay_part = self.mass_part[s], self.rot_part[s], self.pay_part[s]
            for j in range(n):
                m = np.abs(qd[:, j]) > self.min_speed_rad_s
                if m.sum() < 10:
                    continue
                y = tau[m, j].copy()
                blocks: dict[str, np.ndarray] = {}
                if mass_f and inertia_f:
                    blocks["alpha"], blocks["gamma"] = mass_part[m, j], rot_part[m, j]
                elif mass_f:
                    blocks["alpha"] = mass_part[m, j] + si * rot_part[m, j]
                elif inertia_f:
                    y -= sm * mass_part[m, j]
                    blocks["gamma"] = rot_part[m, j]
                else:
                    y -= sm * (mass_part[m, j] + si * rot_part[m, j])
                if payload_f:
                    blocks["payload_kg"] = pay_part[m, j]
                    for axis, parts in self.moment_parts.items():
                        blocks[f"payload_moment[{axis}]"] = parts[s][m, j]
                else:
                    y -= base.payload_kg * pay_part[m, j]
                for k, parts in self.offset_parts.items():
                    blocks[f"joint_offset_rad[{k}]"] = parts[s][m, j]
                for group, col, base_v in (
                    ("armature_kgm2", qdd[m, j], arm_b[j]),
                    ("joint_damping_nms", qd[m, j], damp_b[j]),
                    ("joint_friction_nm", np.sign(qd[m, j]), fric_b[j]),
                ):
                    if group in free:
                        blocks[f"{group}[{j}]"] = col
                    else:
                        y -= base_v * col
                for name in blocks:
                    if name not in cols:
                        cols.append(name)
                blocks_all.append((blocks, y))
        rows_used = sum(y.size for _, y in blocks_all)
        if not cols or rows_used <= len(cols):
            return RegressionResult({}, {}, rows_used, None, lag_s)
        A = np.zeros((rows_used, len(cols)))
        yv = np.concatenate([y for _, y in blocks_all])
        at = 0
        for blocks, y in blocks_all:
            for name, col in blocks.items():
                A[at:at + y.size, cols.index(name)] = col
            at += y.size
        prior = {i: (OFFSET_PRIOR_RAD if c.startswith("joint_offset_rad[") else MOMENT_PRIOR_KGM)
                 for i, c in enumerate(cols)
                 if c.startswith(("joint_offset_rad[", "payload_moment["))}
        if prior:
            # The ridge's weight: the residual without the nuisance over each prior sigma.
            keep = [i for i in range(len(cols)) if i not in prior]
            sol0 = self._lstsq(A[:, keep], yv, [cols[i] for i in keep], bounds)
            sigma = float(np.sqrt(np.mean((yv - A[:, keep] @ sol0) ** 2)))
            ridge = np.zeros((len(prior), len(cols)))
            for r, (i, s_prior) in enumerate(prior.items()):
                ridge[r, i] = sigma / s_prior
            sol = self._lstsq(np.vstack([A, ridge]), np.concatenate([yv, np.zeros(len(prior))]),
                              cols, bounds)
        else:
            sol = self._lstsq(A, yv, cols, bounds)
        residual = float(np.sqrt(np.mean((yv - A @ sol) ** 2)))
        est = dict(zip(cols, sol.tolist()))
        values: dict[str, float] = {}
        nuisance: dict[str, float] = {}
        if "alpha" in est:
            values["mass_scale"] = float(est.pop("alpha"))
        if "gamma" in est:
            values["inertia_scale"] = float(est.pop("gamma") / max(values.get("mass_scale", sm),
                                                                   1e-9))
        moments = {a: est.pop(f"payload_moment[{a}]") for a in AXES
                   if f"payload_moment[{a}]" in est}
        if moments:
            m_pay = est.get("payload_kg", 0.0)
            for a, v in moments.items():
                # The centre of mass relative to the payload's nominal mounting point.
                nuisance[f"payload_com_m[{a}]"] = float(
                    base.payload_offset_m[AXES.index(a)] + (v / m_pay if m_pay > 1e-3 else 0.0))
        for name in [k for k in est if k.startswith("joint_offset_rad[")]:
            nuisance[name] = float(est.pop(name))
        values.update({k: float(v) for k, v in est.items()})
        return RegressionResult(values, nuisance, rows_used, residual, lag_s)

    def _lstsq(self, A: np.ndarray, y: np.ndarray, cols: list[str],
               bounds: Mapping[str, tuple[float, float]] | None) -> np.ndarray:
        """Least squares on column-normalised A (bounded when `bounds`), in A's own units."""
        from scipy.optimize import lsq_linear

        scale = np.maximum(np.abs(A).max(axis=0), 1e-12)
        if bounds is not None:
            lo_b, hi_b = zip(*(self._bounds(name, bounds) for name in cols))
            sol = lsq_linear(A / scale, y,
                             bounds=(np.array(lo_b) * scale, np.array(hi_b) * scale)).x
        else:
            sol = np.linalg.lstsq(A / scale, y, rcond=None)[0]
        return np.asarray(sol) / scale

    @staticmethod
    def _bounds(name: str, bounds: Mapping[str, tuple[float, float]]) -> tuple[float, float]:
        if name == "alpha":
            return bounds["mass_scale"]
        if name == "gamma":
            (m_lo, m_hi), (i_lo, i_hi) = bounds["mass_scale"], bounds["inertia_scale"]
            return m_lo * i_lo, m_hi * i_hi
        if name.startswith(("payload_moment[", "joint_offset_rad[")):
            return -np.inf, np.inf
        return bounds[name.split("[")[0]]

    def scan_lag(self, groups: tuple[str, ...], max_lag_s: float | None = None,
                 step_s: float | None = None) -> LagScan:
        """The effort lag in [0, max_lag] (default 1.5 sample periods) with the least residual.

        A grid of `step_s` (default a quarter period, at most 1 ms), then a parabola through
        the best point and its neighbours.
        """
        if not self.available:
            return LagScan(0.0)
        period = float(np.median([r.sample_period_s for r in self.runs]))
        top = 1.5 * period if max_lag_s is None else float(max_lag_s)
        step = min(0.25 * period, 1e-3) if step_s is None else float(step_s)
        lags = np.arange(0.0, top + 0.5 * step, step)
        res = []
        for lag in lags:
            r = self.solve(groups, float(lag)).residual_rms_nm
            res.append(math.inf if r is None else r)
        c = np.array(res)
        i = int(np.argmin(c))
        best = float(lags[i])
        if 0 < i < c.size - 1 and np.all(np.isfinite(c[i - 1:i + 2])):
            den = c[i - 1] - 2 * c[i] + c[i + 1]
            if den > 0:
                best += 0.5 * step * (c[i - 1] - c[i + 1]) / den
        return LagScan(max(best, 0.0), lags.tolist(), [float(v) for v in c])
