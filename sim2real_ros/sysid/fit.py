"""Fit the sim plant to recorded runs: latency first, identifiability check, then least squares.

0. Efforts are moved onto the joint-state stamps they describe (`effort_lag_s`, given or the
   lag with the least effort-regression residual; sysid/regression.py) before anything reads
   them: the effort regression (the physics start, or with `hold_regression` the held values),
   the drive's start and the shooting residuals.
1. Action latency by cross-correlation: the recorded commands are replayed through the nominal
   plant with no delay over short windows that start at measured states; the lag that best
   aligns the simulated velocity with the measured one is the latency (the servo's own lag
   cancels because both responses share it).
2. Identifiability: the sensitivity of the residuals to each parameter (a finite-difference
   Jacobian on part of the windows) gives the Fisher information; parameters whose Cramér-Rao
   standard deviation is large against their scale, or that are nearly collinear with others,
   are refused (kept at their base value) and named.
3. Multiple shooting: every evaluation replays the commands over short windows (default 0.3 s
   every 1 s) from the measured state at each window start, so errors never accumulate over a
   20 s rollout and one evaluation costs a fraction of the data's duration. Each window is
   compared only after `settle_s` (40 ms): the measured start state is noisy, and through the
   stiff drive its error is a torque transient that would bias damping and gain. Residuals are
   joint positions, velocities and efforts, each divided by its measured noise. Bounded least
   squares (Levenberg-Marquardt, or scipy's trust region) on parameters normalised by their
   typical magnitude; the result is never worse than the start.
4. Confidence from the Jacobian at the optimum; run-to-run spread from one Gauss-Newton step per
   run away from the joint optimum; held-out rollout error (2 s open-loop rollouts on validation
   runs) for the nominal and the calibrated plant.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from sim2real_ros.sim.plant import ArmPlant, PlantParams
from sim2real_ros.sysid.deadtime import DeadTimeError, DeadTimeEstimate, estimate_dead_time
from sim2real_ros.sysid.regression import (
    AXES,
    MAX_ROWS,
    MIN_SPEED_RAD_S,
    PHYSICS_GROUPS,
    EffortRegression,
    align_effort,
    sample_rows,
)
from sim2real_ros.sysid.runs import NoiseProfile, RunData, estimate_noise, observation_latency_s
from sim2real_ros.sysid.shoot import simulate_segment, step_targets

LATENCY = "action_latency_s"
LATENCY_SOURCES = ("auto", "probe", "fit")
# group -> (lower, upper, typical magnitude, per joint)
PARAM_GROUPS: dict[str, tuple[float, float, float, bool]] = {
    "joint_damping_nms": (0.0, 50.0, 0.5, True),
    "joint_friction_nm": (0.0, 30.0, 1.0, True),
    # Down to 0.05: the sim's servo is scheduled at 20 Hz; a 6 Hz drive is kp x 0.09.
    "kp_scale": (0.05, 5.0, 1.0, True),
    "kd_scale": (0.05, 5.0, 1.0, True),
    "armature_kgm2": (0.0, 1.0, 0.01, True),
    "mass_scale": (0.3, 3.0, 1.0, False),
    "inertia_scale": (0.2, 5.0, 1.0, False),
    "payload_kg": (0.0, 20.0, 1.0, False),
    LATENCY: (0.0, 0.2, 0.01, False),
}
DEFAULT_GROUPS = (
    "joint_damping_nms",
    "joint_friction_nm",
    "kp_scale",
    "mass_scale",
    "inertia_scale",
    "payload_kg",
    LATENCY,
)
WARM_START_TRUSTED = ("mass_scale", "payload_kg")
# The payload's centre of mass the regression may place from the tool frame, m per axis.
_PAYLOAD_COM_MAX_M = 0.3
# Noise floors: a perfectly quiet channel must not get infinite weight.
MIN_STD = {"q": 1e-5, "qd": 5e-4, "tau": 0.01}


class FitError(ValueError):
    """The data cannot support the requested fit; the message says why."""


@dataclass
class FitOptions:
    """How to fit: which parameters, window layout, solver limits."""

    groups: tuple[str, ...] = DEFAULT_GROUPS
    window_s: float = 0.3
    window_every_s: float = 1.0
    max_iterations: int = 8
    fd_step: float = 1e-2  # finite-difference step in normalised units (1 % of typical)
    max_rel_std: float = 0.1  # refuse a parameter whose CRB std exceeds 10 % of its scale
    max_vif: float = 1e4  # ... or whose variance inflation (collinearity) exceeds this
    precheck_window_stride: int = 2  # use every 2nd window for the identifiability check
    compare_stride: int = 2  # compare every 2nd sample of a window (halves state reads)
    settle_s: float = 0.04  # simulate this long from each window start before comparing
    max_latency_s: float = 0.1
    validation_runs: tuple[str, ...] | None = None  # None: the last third of the runs
    rollout_s: float = 2.0
    rollout_every_s: float = 2.0
    spread: bool = True  # run-to-run spread (one extra Jacobian on the validation runs)
    solver: str = "lm"  # "lm": bounded Levenberg-Marquardt (default) | "trf": scipy trust region
    physics_dt_s: float = 1e-3
    progress: bool = True
    weights: dict[str, float] = field(default_factory=lambda: {"q": 1.0, "qd": 1.0, "tau": 1.0})
    # Groups taken from the effort regression and held there in the simulation fit, which then
    # fits only the rest (the drive: kp, kd, latency). The regression uses the plant's inverse
    # dynamics and the measured drive torques, not the drive; a simulation fit whose servo
    # model differs from the unit's drive (a PD for a PID) otherwise moves damping, friction
    # and masses to imitate the drive. Their run-to-run spread is that of per-run regressions.
    hold_regression: tuple[str, ...] = ()
    # The reported effort's lag behind the joint-state stamp, s: 0 for a drive that samples
    # its torque at the stamp (the simulator), half the period for one that reports the
    # period's mean (the proxy); None estimates it as the lag with the least effort-regression
    # residual (sysid/regression.py; reliable on period means, not on instant samples).
    effort_lag_s: float | None = 0.0
    # The regression debiased through the simulator's replay (see effort_estimate). None:
    # where the replay samples efforts as the drive does, i.e. when the effort lag is under a
    # quarter of the sample period (a torque sampled at the stamp, as the simulator reports).
    debias_regression: bool | None = None
    # Where the action latency comes from. "fit": the simulation fit (with the other drive
    # parameters; on a unit whose drive is not the simulator's PD it absorbs the drive's lag).
    # "probe": the dead time read at the latency probe's moves from rest (sysid/deadtime.py),
    # held in the simulation fit, which then fits only the drive's gains. "auto": "probe" when
    # a run's recording carries a latency probe (its excitation metadata), else "fit".
    latency_source: str = "auto"

    def check(self) -> None:
        """Raise FitError for an unknown group or an impossible window layout."""
        unknown = [g for g in self.groups if g not in PARAM_GROUPS]
        if unknown:
            raise FitError(f"unknown parameter groups {unknown}; known: {sorted(PARAM_GROUPS)}")
        bad = [g for g in self.hold_regression if g not in self.groups or g in (
            LATENCY, "kp_scale", "kd_scale")]
        if bad:
            raise FitError(f"hold_regression {bad}: expected fitted groups the effort regression "
                           "estimates (not kp_scale, kd_scale or the latency)")
        if not 0.02 <= self.window_s <= self.window_every_s:
            raise FitError(
                f"window_s = {self.window_s}, window_every_s = {self.window_every_s}: "
                "expected 0.02 <= window_s <= window_every_s"
            )
        if not 0.0 <= self.settle_s <= 0.5:
            raise FitError(f"settle_s = {self.settle_s}: expected 0 <= settle_s <= 0.5")
        if self.latency_source not in LATENCY_SOURCES:
            raise FitError(f"latency_source = {self.latency_source!r}: expected one of "
                           f"{list(LATENCY_SOURCES)}")
        if self.effort_lag_s is not None and not (
                math.isfinite(self.effort_lag_s) and 0.0 <= self.effort_lag_s <= 0.1):
            raise FitError(f"effort_lag_s = {self.effort_lag_s}: expected a number in "
                           "[0, 0.1] s, or None to estimate it")


@dataclass(frozen=True)
class ParamDef:
    """One scalar parameter of the fit."""

    name: str  # e.g. 'joint_damping_nms[2]', 'mass_scale', 'action_latency_s'
    group: str
    index: int | None
    lower: float
    upper: float
    typical: float


def param_defs(groups: tuple[str, ...], n_joints: int) -> list[ParamDef]:
    """Expand groups into scalar parameters."""
    out = []
    for g in groups:
        lo, hi, typ, per_joint = PARAM_GROUPS[g]
        if per_joint:
            out += [ParamDef(f"{g}[{i}]", g, i, lo, hi, typ) for i in range(n_joints)]
        else:
            out.append(ParamDef(g, g, None, lo, hi, typ))
    return out


def get_value(params: PlantParams, latency_s: float, d: ParamDef) -> float:
    """Read one parameter from resolved params (or the latency)."""
    if d.group == LATENCY:
        return float(latency_s)
    v = getattr(params, d.group)
    return float(np.asarray(v, dtype=float)[d.index]) if d.index is not None else float(v)


def apply_values(
    base: PlantParams, base_latency_s: float, defs: list[ParamDef], values: np.ndarray
) -> tuple[PlantParams, float]:
    """Return (params, latency) with the given parameter values written over the base."""
    p = base.copy()
    latency = base_latency_s
    for d, v in zip(defs, values):
        if d.group == LATENCY:
            latency = float(v)
        elif d.index is None:
            setattr(p, d.group, float(v))
        else:
            arr = np.array(getattr(p, d.group), dtype=float)
            arr[d.index] = float(v)
            setattr(p, d.group, arr)
    return p, latency


@dataclass
class Window:
    """One shooting window: start sample and the samples compared after it."""

    run: int
    k0: int
    ks: np.ndarray  # measured sample indices compared
    steps: np.ndarray  # physics steps from the window start to each compared sample
    q0: np.ndarray
    qd0: np.ndarray


def make_windows(
    runs: list[RunData],
    window_s: float,
    every_s: float,
    dt_s: float,
    max_latency_s: float,
    offset_s: float = 0.0,
    stride: int = 1,
    settle_s: float = 0.0,
) -> list[Window]:
    """Place windows every `every_s` over the part of each run where commands move.

    A window is simulated for settle_s + window_s and compared only after settle_s: the
    measured start state is noisy (and a few samples' average of it is biased by the
    acceleration), and with a stiff drive a start-state error of 1e-5 rad is a torque
    transient of ~0.4 N·m that lasts a few servo time constants. Compared from the first
    sample, these transients bias damping and gain (see docs/sysid.md).
    """
    windows = []
    for r, run in enumerate(runs):
        moving = np.flatnonzero(np.any(np.abs(np.diff(run.cmd, axis=0)) > 1e-9, axis=1))
        if moving.size == 0:
            continue
        start = max(run.cmd_t_s[moving[0]] - 0.1, run.cmd_t_s[0] + max_latency_s, run.t_s[2])
        stop = min(run.cmd_t_s[moving[-1]] + 0.5, run.t_s[-3] - window_s - settle_s)
        settle_steps = int(round(settle_s / dt_s))
        t = start + offset_s
        while t <= stop:
            k0 = int(np.searchsorted(run.t_s, t))
            kend = int(np.searchsorted(run.t_s, run.t_s[k0] + settle_s + window_s,
                                       side="right"))
            ks = np.arange(k0 + stride, min(kend, run.t_s.size), stride)
            steps = np.round((run.t_s[ks] - run.t_s[k0]) / dt_s).astype(int)
            keep = steps >= max(1, settle_steps)
            ks, steps = ks[keep], steps[keep]
            if ks.size >= 5:
                lo, hi = max(k0 - 2, 0), k0 + 3
                # Symmetric averages keep the start state unbiased while halving its noise.
                q0 = run.q[lo:hi].mean(axis=0) if k0 >= 2 else run.q[k0]
                qd0 = run.qd[lo:hi].mean(axis=0) if k0 >= 2 else run.qd[k0]
                windows.append(Window(r, k0, ks, steps, q0, qd0))
            t += every_s
    return windows


@dataclass
class Weights:
    """Per-joint standard deviations that normalise each residual channel."""

    q: np.ndarray
    qd: np.ndarray
    tau: np.ndarray | None


def make_weights(noise: NoiseProfile | None, n: int, use_tau: bool) -> Weights:
    """Return residual scales from the measured noise (with floors)."""
    if noise is None:
        q, qd, tau = np.full(n, 1e-4), np.full(n, 5e-3), np.full(n, 0.1)
    else:
        q = np.asarray(noise.joint_position_std_rad)
        qd = np.asarray(noise.joint_velocity_std_rad_s)
        tau = (
            np.asarray(noise.joint_effort_std_nm)
            if noise.joint_effort_std_nm is not None
            else np.full(n, 0.1)
        )
    return Weights(
        np.maximum(q, MIN_STD["q"]),
        np.maximum(qd, MIN_STD["qd"]),
        np.maximum(tau, MIN_STD["tau"]) if use_tau else None,
    )


class ShootingProblem:
    """Residuals of the plant replaying the recorded commands over windows."""

    def __init__(
        self,
        plant: ArmPlant,
        runs: list[RunData],
        windows: list[Window],
        weights: Weights,
        channel_weights: dict[str, float] | None = None,
    ) -> None:
        self.plant = plant
        self.runs = runs
        self.windows = windows
        self.weights = weights
        self.cw = {"q": 1.0, "qd": 1.0, "tau": 1.0, **(channel_weights or {})}
        self.evaluations = 0
        # Row layout: for each window, samples x [q, qd, (tau)] x joints.
        n = plant.n
        per = 3 if weights.tau is not None else 2
        sizes = [w.ks.size * per * n for w in windows]
        self.row_window = np.repeat(np.arange(len(windows)), sizes)
        self.row_run = np.array([windows[i].run for i in self.row_window], dtype=int)

    def simulate(self, params: PlantParams, latency_s: float) -> list[tuple[np.ndarray, ...]]:
        """Return (q, qd, tau) predicted for each window."""
        self.plant.set_params(params)
        dt = self.plant.physics_dt_s
        out = []
        for w in self.windows:
            run = self.runs[w.run]
            n_steps = int(w.steps[-1])
            targets = step_targets(run.cmd_t_s, run.cmd, latency_s, run.t_s[w.k0], n_steps, dt)
            seg = simulate_segment(self.plant, w.q0, w.qd0, targets, w.steps)
            out.append((seg.q, seg.qd, seg.tau))
        self.evaluations += 1
        return out

    def residuals(self, params: PlantParams, latency_s: float) -> np.ndarray:
        """Return the stacked, noise-normalised residual vector."""
        sims = self.simulate(params, latency_s)
        parts = []
        wt = self.weights
        for w, (q, qd, tau) in zip(self.windows, sims):
            run = self.runs[w.run]
            blocks = [
                self.cw["q"] * (q - run.q[w.ks]) / wt.q,
                self.cw["qd"] * (qd - run.qd[w.ks]) / wt.qd,
            ]
            if wt.tau is not None and run.tau is not None:
                blocks.append(self.cw["tau"] * (tau - run.tau[w.ks]) / wt.tau)
            parts.append(np.hstack(blocks).ravel())
        return np.concatenate(parts) if parts else np.zeros(0)


@dataclass
class LatencyEstimate:
    """Latency found by cross-correlation."""

    action_latency_s: float  # measured response behind the zero-delay simulated response
    response_lag_s: float  # measured response behind the command (latency + servo lag)
    per_run_s: list[float]


def estimate_latency(
    plant: ArmPlant,
    runs: list[RunData],
    params: PlantParams,
    max_latency_s: float,
    window_s: float = 2.0,
) -> LatencyEstimate:
    """Cross-correlate simulated (no delay) and measured joint velocities over 2 s windows.

    Windows start at measured states and tile each run, so the cost is one replay of the data.
    The lag of the measured velocity behind the command (dead time plus servo lag) is returned
    too, for the report.
    """
    dt_phys = plant.physics_dt_s
    windows = make_windows(runs, window_s, window_s, dt_phys, max_latency_s)
    if not windows:
        raise FitError("no window to estimate latency from (do the commands move?)")
    problem = ShootingProblem(plant, runs, windows, make_weights(None, plant.n, False))
    sims = problem.simulate(params, 0.0)
    estimates, lags_cmd = [], []
    for r, run in enumerate(runs):
        dt = run.sample_period_s
        max_lag = int(math.ceil(max_latency_s / dt))
        lags = np.arange(-min(5, max_lag), max_lag + 1)
        # Energy-normalised cross-correlation as a lagged squared difference: a plain product
        # sum is dominated by the 100 Hz staircase of the command and by low frequencies, the
        # difference is sharp at the true lag. Means are removed per window because a model
        # that sags differently under gravity must not move the lag.
        e_sim = np.zeros(lags.size)
        e_cmd = np.zeros(lags.size)
        counts = np.zeros(lags.size)
        for w, (q_sim, _, _) in zip(windows, sims):
            if w.run != r:
                continue
            a = q_sim - q_sim.mean(axis=0)
            b = run.q[w.ks] - run.q[w.ks].mean(axis=0)
            u = run.command_at(run.t_s[w.ks])
            u = u - u.mean(axis=0)
            for i, lag in enumerate(lags):
                if lag >= 0:
                    x, y, z = a[: a.shape[0] - lag], b[lag:], u[: u.shape[0] - lag]
                else:
                    x, y, z = a[-lag:], b[: b.shape[0] + lag], u[-lag:]
                e_sim[i] += np.sum((x - x.mean(axis=0) - y + y.mean(axis=0)) ** 2)
                e_cmd[i] += np.sum((z - z.mean(axis=0) - y + y.mean(axis=0)) ** 2)
                counts[i] += x.shape[0]
        if counts.sum() > 0:
            estimates.append(_peak(lags, -e_sim / np.maximum(counts, 1)) * dt)
            lags_cmd.append(_peak(lags, -e_cmd / np.maximum(counts, 1)) * dt)
    if not estimates:
        raise FitError("no window to estimate latency from (do the commands move?)")
    return LatencyEstimate(
        float(np.clip(np.median(estimates), 0.0, max_latency_s)),
        float(np.median(lags_cmd)),
        [float(e) for e in estimates],
    )


def _peak(lags: np.ndarray, c: np.ndarray) -> float:
    i = int(np.argmax(c))
    frac = 0.0
    if 0 < i < c.size - 1:
        den = c[i - 1] - 2 * c[i] + c[i + 1]
        if den < 0:
            frac = 0.5 * (c[i - 1] - c[i + 1]) / den
    return float(lags[i] + frac)


@dataclass
class Identifiability:
    """Outcome of the pre-check: which parameters the data determine."""

    kept: list[str]
    refused: dict[str, str]  # name -> why
    rel_std: dict[str, float]  # Cramér-Rao std / typical magnitude, at the check
    vif: dict[str, float]


def check_identifiability(
    jac: np.ndarray, names: list[str], max_rel_std: float, max_vif: float
) -> Identifiability:
    """Drop, one at a time, the parameter worst determined by the data until all are fine."""
    active = list(range(len(names)))
    refused: dict[str, str] = {}
    rel: dict[str, float] = {}
    vifs: dict[str, float] = {}
    while active:
        j = jac[:, active]
        fisher = j.T @ j
        norms = np.sqrt(np.diag(fisher))
        dead = [a for a, nrm in zip(active, norms) if nrm < 1e-9 * max(norms.max(), 1e-300)]
        if dead or norms.max() == 0.0:
            for a in dead or active:
                refused[names[a]] = "the data do not excite it (zero sensitivity)"
                rel[names[a]] = math.inf
                vifs[names[a]] = math.inf
            active = [a for a in active if a not in (dead or active)]
            continue
        cov = np.linalg.pinv(fisher, rcond=1e-14)
        std = np.sqrt(np.clip(np.diag(cov), 0.0, None))
        corr = fisher / np.outer(norms, norms)
        vif = np.diag(np.linalg.pinv(corr, rcond=1e-14))
        score = np.maximum(std / max_rel_std, vif / max_vif)
        worst = int(np.argmax(score))
        for a, s, v in zip(active, std, vif):
            rel[names[a]] = float(s)
            vifs[names[a]] = float(v)
        if score[worst] <= 1.0:
            break
        a = active.pop(worst)
        refused[names[a]] = (
            f"not determined by the data: Cramér-Rao std {std[worst]:.3g} x its scale "
            f"(limit {max_rel_std:g}), variance inflation {vif[worst]:.3g} (limit {max_vif:g})"
        )
    return Identifiability([names[a] for a in active], refused, rel, vifs)


@dataclass
class RolloutError:
    """Open-loop rollout error on a set of runs."""

    rms_q_rad: np.ndarray  # per joint
    rms_q_total_rad: float
    rms_tau_nm: np.ndarray | None
    n_rollouts: int


@dataclass
class FitResult:
    """Everything the calibration file and the report need."""

    joint_names: list[str]
    base_params: PlantParams
    params: PlantParams  # base with the fitted values written in (resolved)
    action_latency_s: float
    latency: LatencyEstimate
    defs: list[ParamDef]
    fitted: dict[str, float]
    std: dict[str, float]
    spread: dict[str, float]
    per_run: dict[str, dict[str, float]]
    identifiability: Identifiability
    train_runs: list[str]
    validation_runs: list[str]
    in_sample_validation: bool
    error_nominal: RolloutError
    error_calibrated: RolloutError
    noise: NoiseProfile | None
    observation_latency_s: float | None
    cost_initial: float
    cost_final: float
    evaluations: int
    iterations: int
    n_windows: int
    duration_s: float
    traces: dict[str, Any] = field(default_factory=dict)
    # The effort's lag behind the stamps (estimated or given) and, when estimated, the
    # regression's residual per lag tried: {"lags_s": [...], "residual_rms_nm": [...]}.
    effort_lag_s: float = 0.0
    effort_lag_scan: dict[str, list[float]] | None = None
    # Estimated by the effort regression alongside the physics, not plant parameters:
    # 'joint_offset_rad[k]' (the encoder's offset, measured - true) and 'payload_com_m[x|y|z]'.
    regression_nuisance: dict[str, float] = field(default_factory=dict)
    # "probe" (the action latency is the dead time read at the latency probe, held) or "fit";
    # the probe's estimate whenever the runs carry one (DeadTimeEstimate.to_dict()).
    latency_source: str = "fit"
    dead_time: dict[str, Any] | None = None

    @property
    def improvement(self) -> float:
        """Return held-out rollout error nominal / calibrated."""
        return self.error_nominal.rms_q_total_rad / max(self.error_calibrated.rms_q_total_rad,
                                                        1e-12)



@dataclass
class WarmStart:
    """Linear-regression estimates that start the least squares near the answer."""

    values: dict[str, float]
    latency_s: float | None  # latency that best explains the servo torques (None: not tried)
    rows: int
    residual_rms_nm: float | None = None  # the regression's RMS effort residual
    # Estimated alongside, not plant parameters: encoder offsets, the payload's centre of mass
    nuisance: dict[str, float] = field(default_factory=dict)


def _target_at(run: RunData, t_s: np.ndarray, latency_s: float, dt_s: float) -> np.ndarray:
    """Return the delayed command averaged over the physics step starting at each time."""
    edges = run.cmd_t_s + latency_s
    i0 = np.clip(np.searchsorted(edges, t_s, side="right") - 1, 0, edges.size - 1)
    i1 = np.clip(np.searchsorted(edges, t_s + dt_s, side="right") - 1, 0, edges.size - 1)
    # At most one edge falls inside a step (commands are >= one step apart).
    frac = np.clip((t_s + dt_s - edges[i1]) / dt_s, 0.0, 1.0)[:, None]
    same = (i0 == i1)[:, None]
    return np.where(same, run.cmd[i1], (1.0 - frac) * run.cmd[i0] + frac * run.cmd[i1])


@dataclass
class ServoStart:
    """Servo gain scales and latency that best explain the measured drive torques."""

    kp_scale: np.ndarray
    latency_s: float
    rows: int


def servo_start(
    plant: ArmPlant,
    runs: list[RunData],
    base: PlantParams,
    latency_s: float,
    max_latency_s: float,
    max_rows: int = 1500,
    scan_latency: bool = True,
) -> ServoStart | None:
    """Fit the drive's position-gain scales and the latency to the measured efforts.

    The plant's drive is a PD, tau = kp(q)·(u(t - L) - q) - kd(q)·q̇ (the cascade form is the
    same below its velocity clamp), with gains it schedules from the arm's inertia. The gains
    are read from the plant itself at every sampled pose, so this follows however the drive
    schedules them; the scale of kp is then linear, and the latency is scanned (1 ms grid
    around the cross-correlation estimate, then a bounded search) unless `scan_latency` is
    False (a measured latency: only the gains are fitted). No simulation needed.
    """
    from scipy.optimize import minimize_scalar

    if any(r.tau is None for r in runs):
        return None
    base = plant.resolved_params(base)
    plant.set_params(base)
    dt = plant.physics_dt_s
    kp_base = np.asarray(base.kp_scale, dtype=float)
    total = sum(r.t_s.size for r in runs)
    stride = max(1.0, total / max_rows)
    lim = 0.95 * plant.effort_limit_nm
    rows = []
    for i, r in enumerate(runs):
        assert r.tau is not None
        k = sample_rows(2, r.t_s.size, stride, seed=i)
        # the reported torque is the one of the step that ends at the stamp
        q_prev = r.q[k] - dt * r.qd[k]
        gains = []
        for q in q_prev:
            plant.reset(q)
            gains.append(plant.servo_gains)
        kp = np.array([g[0] for g in gains]) / np.maximum(kp_base, 1e-12)
        kd = np.array([g[1] for g in gains])
        slow = np.abs(r.qd[k]) < 0.9 * plant.arm.max_velocity_rad_s * 0.5
        ok = (np.abs(r.tau[k]) < lim) & slow
        rows.append((r, k, q_prev, kp, kd, ok))

    def servo_fit(lat: float) -> tuple[float, np.ndarray]:
        xs, ys, oks = [], [], []
        for r, k, q_prev, kp, kd, ok in rows:
            assert r.tau is not None
            u = _target_at(r, r.t_s[k] - dt, lat, dt)
            xs.append(kp * (u - q_prev))
            ys.append(r.tau[k] + kd * r.qd[k])
            oks.append(ok)
        x, y, m = np.vstack(xs), np.vstack(ys), np.vstack(oks)
        scale = np.array([float(x[m[:, j], j] @ y[m[:, j], j]) /
                          max(float(x[m[:, j], j] @ x[m[:, j], j]), 1e-300)
                          for j in range(x.shape[1])])
        resid = np.where(m, y - scale * x, 0.0)
        return float(np.sum(resid**2)), scale

    if not scan_latency:
        _, scale = servo_fit(float(latency_s))
        lo, hi = PARAM_GROUPS["kp_scale"][:2]
        return ServoStart(np.clip(scale, lo, hi), float(latency_s),
                          int(sum(r[1].size for r in rows)))
    grid = np.unique(np.clip(latency_s + np.arange(-0.015, 0.01501, 0.001), 0.0,
                             max_latency_s))
    coarse = [servo_fit(float(L))[0] for L in grid]
    g = float(grid[int(np.argmin(coarse))])
    fine = minimize_scalar(lambda L: servo_fit(float(L))[0],
                           bounds=(max(g - 0.001, 0.0), min(g + 0.001, max_latency_s)),
                           method="bounded", options={"xatol": 2e-5})
    best = float(fine.x)
    _, scale = servo_fit(best)
    lo, hi = PARAM_GROUPS["kp_scale"][:2]
    return ServoStart(np.clip(scale, lo, hi), best, int(sum(r[1].size for r in rows)))


def regression_start(
    plant: ArmPlant,
    runs: list[RunData],
    base: PlantParams,
    groups: tuple[str, ...],
    latency_s: float,
    max_latency_s: float,
    max_rows: int = 4000,
    min_speed_rad_s: float = 0.03,
    trusted_only: bool = True,
    bounded: bool = True,
    nuisance: bool = False,
) -> WarmStart:
    """Estimate rigid-body, damping, friction and armature by linear least squares on efforts.

    `sysid.regression.EffortRegression` (measured effort = M(q)q̈ + h(q, q̇) + b q̇ + F sign(q̇),
    linear in mass scale, mass x inertia scale, payload, armature, damping and friction; with
    `nuisance`, encoder offsets and the payload's centre of mass alongside). Only the plant's
    inverse dynamics is used, not its drive: servo gains and latency are left to the simulation
    fit. The efforts are taken as they are: align them first (`align_effort`). With
    `trusted_only`, only the values WARM_START_TRUSTED lists are returned (a start for the
    simulation fit); `bounded` clips to the groups' bounds. Needs efforts; no values otherwise.
    """
    del latency_s, max_latency_s  # kept in the signature for callers; the drive is not modelled
    design = EffortRegression(plant, runs, base, max_rows, min_speed_rad_s, nuisance)
    bounds = {g: PARAM_GROUPS[g][:2] for g in PARAM_GROUPS} if bounded else None
    res = design.solve(tuple(groups), 0.0, bounds)
    values = res.values
    if trusted_only:
        values = {k: v for k, v in values.items() if k in WARM_START_TRUSTED}
    for name, v in list(values.items()):
        lo_, hi_ = PARAM_GROUPS[name.split("[")[0]][:2]
        values[name] = float(np.clip(v, lo_, hi_)) if bounded else float(v)
    return WarmStart(values, None, res.rows, res.residual_rms_nm, res.nuisance)


def effort_estimate(
    plant: ArmPlant,
    runs: list[RunData],
    base: PlantParams,
    defs: list[ParamDef],
    groups: tuple[str, ...],
    latency_s: float,
    max_latency_s: float,
    drive: dict[str, float],
    debias: bool = False,
) -> WarmStart:
    """The effort regression of these runs (efforts aligned to their stamps): the fit's start,
    and with `hold_regression` its held values (per run for their spread).

    `debias`: take the mass and payload from the bounded regression and the rest from
    `debiased_regression` (the regression on the measured runs minus the one on the simulator's
    replay). That was the default while the proxy reported one physics step's torque: those
    snapshots of a PID fed a 100 Hz staircase biased the regression and the replay reproduced
    part of it. On efforts averaged over the sample period and aligned, the replay's own
    snapshots only add their ripple (armature +34 % on the shoulder lift in the study), so the
    regression is used directly.
    """
    if not debias:
        # Used as it is, the regression also estimates the encoder offsets and the payload's
        # centre of mass. Not under the debias: the replay's regression and the measured one
        # differ in their sampling bias, which those columns then absorb (a 6 s synthetic run:
        # the payload's centre of mass 10 cm off, damping -60 % after the fit).
        # Rows under MIN_SPEED_RAD_S (0.1 rad/s) are left out: dry friction there is not
        # F sign(q̇). The debiased path keeps 0.03 rad/s, where the replay's regression carries
        # the same rows' bias and the difference removes it.
        warm = regression_start(plant, runs, base, groups, latency_s, max_latency_s,
                                max_rows=MAX_ROWS, min_speed_rad_s=MIN_SPEED_RAD_S,
                                trusted_only=False, bounded=True, nuisance=True)
        warm.values.update(drive)
        return warm
    warm = regression_start(plant, runs, base, groups, latency_s, max_latency_s)
    warm.values.update(drive)
    if warm.rows:
        warm.values.update(debiased_regression(plant, runs, base, defs, warm.values, latency_s,
                                               groups, max_latency_s))
    return warm


def debiased_regression(
    plant: ArmPlant,
    runs: list[RunData],
    base: PlantParams,
    defs: list[ParamDef],
    start: dict[str, float],
    latency_s: float,
    groups: tuple[str, ...],
    max_latency_s: float,
    window_s: float = 2.0,
    settle_s: float = 0.04,
) -> dict[str, float]:
    """Remove the effort regression's bias by running it on simulated data too (one step).

    The regression is biased by how efforts are sampled (the torque of one physics step per
    joint state under a command staircase), but the simulator reproduces that sampling. So the
    regression is run on the measured runs and on the plant's replay of the same commands at the
    start values, over the same 2 s windows; start + (measured - simulated) is the estimate.
    """
    params, _ = apply_values(base, latency_s, defs,
                             np.array([start.get(d.name, get_value(base, latency_s, d))
                                       for d in defs]))
    windows = make_windows(runs, window_s, window_s, plant.physics_dt_s, max_latency_s,
                           settle_s=settle_s)
    if not windows:
        return {}
    sims = ShootingProblem(plant, runs, windows, make_weights(None, plant.n, False)).simulate(
        params, latency_s)
    measured, simulated = [], []
    for w, (q, qd, tau) in zip(windows, sims):
        r = runs[w.run]
        assert r.tau is not None
        seg = dict(joint_names=r.joint_names, t_s=r.t_s[w.ks], cmd_t_s=r.cmd_t_s, cmd=r.cmd)
        measured.append(RunData(name=r.name, q=r.q[w.ks], qd=r.qd[w.ks], tau=r.tau[w.ks], **seg))
        simulated.append(RunData(name=r.name, q=q, qd=qd, tau=tau, **seg))
    reg = [d.name for d in defs if d.group in ("joint_damping_nms", "joint_friction_nm",
                                               "mass_scale", "inertia_scale", "payload_kg",
                                               "armature_kgm2")]
    meas = regression_start(plant, measured, base, groups, latency_s, max_latency_s,
                            trusted_only=False, bounded=False).values
    sim = regression_start(plant, simulated, base, groups, latency_s, max_latency_s,
                           trusted_only=False, bounded=False).values
    plant.set_params(params)
    out = {}
    for d in defs:
        if d.name in reg and d.name in meas and d.name in sim:
            v0 = start.get(d.name, get_value(params, latency_s, d))
            out[d.name] = float(np.clip(v0 + meas[d.name] - sim[d.name], d.lower, d.upper))
    return out


def _progress(total: int, enabled: bool, desc: str) -> Any:
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="sim", leave=False)


def rollout_error(
    plant: ArmPlant,
    runs: list[RunData],
    params: PlantParams,
    latency_s: float,
    horizon_s: float,
    every_s: float,
    max_latency_s: float,
    keep_traces: bool = False,
) -> tuple[RolloutError, list[dict[str, np.ndarray]]]:
    """Roll the plant open-loop from measured states for horizon_s; RMS error against data."""
    dt = plant.physics_dt_s
    windows = make_windows(runs, horizon_s, every_s, dt, max_latency_s, stride=2)
    if not windows:
        raise FitError("runs too short for a held-out rollout")
    problem = ShootingProblem(plant, runs, windows, make_weights(None, plant.n, False))
    sims = problem.simulate(params, latency_s)
    err_q, err_tau, traces = [], [], []
    for w, (q, _qd, tau) in zip(windows, sims):
        run = runs[w.run]
        err_q.append(q - run.q[w.ks])
        if run.tau is not None:
            err_tau.append(tau - run.tau[w.ks])
        if keep_traces:
            traces.append({"run": np.array(w.run), "t_s": run.t_s[w.ks], "q_sim": q,
                           "q_meas": run.q[w.ks], "tau_sim": tau,
                           "tau_meas": run.tau[w.ks] if run.tau is not None else tau * np.nan})
    eq = np.vstack(err_q)
    per_joint = np.sqrt(np.mean(eq**2, axis=0))
    et = np.sqrt(np.mean(np.vstack(err_tau) ** 2, axis=0)) if err_tau else None
    return RolloutError(per_joint, float(np.sqrt(np.mean(eq**2))), et, len(windows)), traces


def split_runs(runs: list[RunData], validation: tuple[str, ...] | None) -> tuple[list[int], list[int]]:
    """Return (train, validation) run indices; by name, or the last third of the runs."""
    names = [r.name for r in runs]
    if validation is not None:
        unknown = [v for v in validation if v not in names]
        if unknown:
            raise FitError(f"validation runs {unknown} are not among the runs {names}")
        val = [i for i, nm in enumerate(names) if nm in validation]
    elif len(runs) >= 2:
        val = list(range(len(runs) - max(1, round(len(runs) / 3)), len(runs)))
    else:
        val = []
    train = [i for i in range(len(runs)) if i not in val]
    if not train:
        raise FitError("every run is a validation run; keep at least one for training")
    return train, val


def fit(
    runs: list[RunData],
    options: FitOptions | None = None,
    plant: ArmPlant | None = None,
    base_params: PlantParams | None = None,
    log: Callable[[str], None] | None = None,
) -> FitResult:
    """Identify plant parameters and action latency from runs (see the module docstring)."""
    opts = options or FitOptions()
    opts.check()
    say = log or (lambda _m: None)
    t_start = time.monotonic()
    if not runs:
        raise FitError("no runs to fit")
    names = runs[0].joint_names
    for r in runs:
        r.validate()
        if r.joint_names != names:
            raise FitError(f"run {r.name} has joints {r.joint_names}, run {runs[0].name} {names}")
    own_plant = plant is None
    plant = plant or ArmPlant(physics_dt_s=opts.physics_dt_s)
    try:
        if plant.joint_names != names:
            raise FitError(f"runs have joints {names}, the plant {plant.joint_names}")
        return _fit(runs, opts, plant, base_params, say, t_start)
    finally:
        if own_plant:
            plant.close()


def _fit(
    runs: list[RunData],
    opts: FitOptions,
    plant: ArmPlant,
    base_params: PlantParams | None,
    say: Callable[[str], None],
    t_start: float,
) -> FitResult:
    n = plant.n
    base = plant.resolved_params(base_params or PlantParams())
    train_idx, val_idx = split_runs(runs, opts.validation_runs)
    use_tau = all(r.tau is not None for r in runs)
    effort_lag, lag_scan = 0.0, None
    if use_tau:
        if opts.effort_lag_s is None:
            physics = tuple(g for g in opts.groups if g in PHYSICS_GROUPS) or PHYSICS_GROUPS
            scan = EffortRegression(plant, [runs[i] for i in train_idx], base).scan_lag(physics)
            effort_lag = scan.lag_s
            lag_scan = {"lags_s": scan.lags_s, "residual_rms_nm": scan.residual_rms_nm}
            say(f"effort lag behind the stamps: {effort_lag * 1e3:.2f} ms (least regression "
                f"residual over {len(scan.lags_s)} lags)")
        else:
            effort_lag = float(opts.effort_lag_s)
            say(f"effort lag behind the stamps: {effort_lag * 1e3:.2f} ms (given)")
        runs = align_effort(runs, effort_lag)
    train = [runs[i] for i in train_idx]
    val = [runs[i] for i in val_idx]
    noise = estimate_noise(runs)
    debias = opts.debias_regression
    if debias is None:
        period = float(np.median([r.sample_period_s for r in runs]))
        debias = use_tau and effort_lag < 0.25 * period
    weights = make_weights(noise, n, use_tau)
    dt = plant.physics_dt_s
    windows = make_windows(train, opts.window_s, opts.window_every_s, dt, opts.max_latency_s,
                           stride=opts.compare_stride, settle_s=opts.settle_s)
    if len(windows) < 3:
        raise FitError(
            f"only {len(windows)} fit windows in the training runs; record longer excitations"
        )
    problem = ShootingProblem(plant, train, windows, weights, opts.weights)
    say(f"{len(train)} training runs, {len(val)} validation runs, {len(windows)} windows")

    # 1. latency by cross-correlation, before anything else
    lat = estimate_latency(plant, train, base, opts.max_latency_s)
    say(f"latency (cross-correlation): {lat.action_latency_s * 1e3:.1f} ms "
        f"(command-to-response lag {lat.response_lag_s * 1e3:.1f} ms)")
    latency0 = lat.action_latency_s
    source, dead = _dead_time(runs, opts, use_tau, say)
    if source == "probe":
        assert dead is not None
        latency0 = dead.dead_time_s

    defs = param_defs(tuple(opts.groups), n)
    drive: dict[str, float] = {}
    if "kp_scale" in opts.groups or LATENCY in opts.groups:
        servo = servo_start(plant, train, base, latency0, opts.max_latency_s,
                            scan_latency=source == "fit")
        if servo is not None:
            if LATENCY in opts.groups and source == "fit":
                latency0 = servo.latency_s
            if "kp_scale" in opts.groups:
                drive = {f"kp_scale[{j}]": float(v) for j, v in enumerate(servo.kp_scale)}
            say(f"drive torques: latency {servo.latency_s * 1e3:.2f} ms, kp scale "
                f"{np.round(servo.kp_scale, 3).tolist()}")
    warm = effort_estimate(plant, train, base, defs, tuple(opts.groups), latency0,
                           opts.max_latency_s, drive, debias)
    if warm.rows:
        how = ("bias removed through the simulator" if debias
               else f"residual {warm.residual_rms_nm or math.nan:.3g} N·m")
        say(f"start (effort regression, {how}): " + ", ".join(
            f"{k}={v:.3g}" for k, v in warm.values.items() if not k.startswith("kp_scale")))
        if warm.nuisance:
            say("estimated alongside: " + ", ".join(
                f"{k}={v:.3g}" for k, v in warm.nuisance.items()))
    com = [warm.nuisance.get(f"payload_com_m[{a}]") for a in AXES]
    if "payload_kg" in opts.groups and all(c is not None for c in com):
        # The simulator carries the payload where the regression found its centre of mass.
        base.payload_offset_m = np.clip(np.array(com, dtype=float), -_PAYLOAD_COM_MAX_M,
                                        _PAYLOAD_COM_MAX_M)
    x0 = np.array([warm.values.get(d.name, get_value(base, latency0, d)) for d in defs])
    typ = np.array([d.typical for d in defs])
    lo = np.array([d.lower for d in defs])
    hi = np.array([d.upper for d in defs])
    x0 = np.clip(x0, lo, hi)

    def residual_of(x: np.ndarray, prob: ShootingProblem) -> np.ndarray:
        p, lat_s = apply_values(base, latency0, defs, x)
        return prob.residuals(p, lat_s)

    def jacobian(
        x: np.ndarray, f0: np.ndarray, prob: ShootingProblem, idx: list[int], bar: Any
    ) -> np.ndarray:
        jac = np.zeros((f0.size, len(idx)))
        for c, i in enumerate(idx):
            h = opts.fd_step * typ[i]
            xp = x.copy()
            # step inwards at an upper bound so the plant never sees an invalid value
            xp[i] = x[i] + h if x[i] + h <= hi[i] else x[i] - h
            jac[:, c] = (residual_of(xp, prob) - f0) / ((xp[i] - x[i]) / typ[i])
            if bar is not None:
                bar.update(1)
        return jac

    # 2. identifiability pre-check on part of the windows
    sub = ShootingProblem(plant, train, windows[:: max(1, opts.precheck_window_stride)],
                          weights, opts.weights)
    bar = _progress(len(defs) + 1, opts.progress, "sysid pre-check")
    f_sub = residual_of(x0, sub)
    j_sub = jacobian(x0, f_sub, sub, list(range(len(defs))), bar)
    if bar is not None:
        bar.close()
    # Information grows with the data: the subset's Jacobian, scaled to all windows, predicts
    # the Cramér-Rao bound of the fit that follows.
    j_all = j_sub * math.sqrt(len(windows) / max(len(sub.windows), 1))
    ident = check_identifiability(j_all, [d.name for d in defs], opts.max_rel_std, opts.max_vif)
    for name, why in ident.refused.items():
        say(f"refusing {name}: {why}")
    held = [i for i, d in enumerate(defs)
            if d.group in opts.hold_regression and d.name in warm.values]
    if held:
        say("held at the effort regression: " + ", ".join(defs[i].name for i in held))
    if source == "probe" and LATENCY in opts.groups:
        held.append(next(i for i, d in enumerate(defs) if d.name == LATENCY))
        say(f"{LATENCY} held at the probe's dead time, {latency0 * 1e3:.2f} ms")
    # The pre-check judges the simulation fit, which does not move them.
    for i in held:
        ident.refused.pop(defs[i].name, None)
    free = [i for i, d in enumerate(defs) if d.name in ident.kept and i not in held]
    if not free:
        raise FitError("no parameter is identifiable from these runs: " + str(ident.refused))

    # 3. bounded least squares over the identifiable parameters (normalised units)
    cache: dict[bytes, np.ndarray] = {}
    bar = _progress(opts.max_iterations * (len(free) + 1), opts.progress, "sysid fit")

    def full_x(z: np.ndarray) -> np.ndarray:
        x = x0.copy()
        x[free] = z * typ[free]
        return x

    def fun(z: np.ndarray) -> np.ndarray:
        key = z.tobytes()
        if key not in cache:
            cache.clear()
            cache[key] = residual_of(full_x(z), problem)
            if bar is not None:
                bar.update(1)
        return cache[key]

    def jac(z: np.ndarray) -> np.ndarray:
        f0 = fun(z)
        return jacobian(full_x(z), f0, problem, free, bar)

    z0 = x0[free] / typ[free]
    f_init = fun(z0)
    cost0 = 0.5 * float(f_init @ f_init)
    if opts.solver == "trf":
        res = least_squares(
            fun, z0, jac=jac, bounds=(lo[free] / typ[free], hi[free] / typ[free]),
            method="trf", x_scale=1.0, max_nfev=opts.max_iterations, xtol=1e-6, ftol=1e-8,
        )
    else:
        res = levenberg_marquardt(fun, jac, z0, lo[free] / typ[free], hi[free] / typ[free],
                                  opts.max_iterations)
    if bar is not None:
        bar.close()
    if not res.cost <= cost0:
        # Never hand back a point worse than the start (a solver that failed, a NaN).
        say(f"the solver ended above its start (cost {res.cost:.4g} > {cost0:.4g}); "
            "keeping the start values")
        res = SolverResult(z0, cost0, f_init, jac(z0), res.nfev, 3,
                           "kept the start values: no evaluated point was better")
    x_hat = full_x(res.x)
    params_hat, latency_hat = apply_values(base, latency0, defs, x_hat)
    params_hat = plant.resolved_params(params_hat)
    say(f"cost {cost0:.4g} -> {res.cost:.4g} in {res.nfev} evaluations ({res.status}: "
        f"{res.message})")

    # 4. confidence, run-to-run spread, held-out error
    jf = np.asarray(res.jac)
    m, p = jf.shape
    dof = max(m - p, 1)
    s2 = 2.0 * res.cost / dof
    cov = np.linalg.pinv(jf.T @ jf) * s2
    std_z = np.sqrt(np.clip(np.diag(cov), 0.0, None))
    fitted = {defs[i].name: float(x_hat[i]) for i in free}
    std = {defs[i].name: float(std_z[c] * typ[i]) for c, i in enumerate(free)}

    per_run: dict[str, dict[str, float]] = {}
    rows_run = problem.row_run
    f_hat = np.asarray(res.fun)
    for local, run in enumerate(train):
        rows = rows_run == local
        per_run[run.name] = _gn_step(jf[rows], f_hat[rows], res.x, typ, free, defs)
    if val and opts.spread:
        vwin = make_windows(val, opts.window_s, opts.window_every_s, dt, opts.max_latency_s,
                            stride=opts.compare_stride, settle_s=opts.settle_s)
        if vwin:
            vprob = ShootingProblem(plant, val, vwin, weights, opts.weights)
            bar = _progress(len(free) + 1, opts.progress, "sysid spread")
            fv = residual_of(x_hat, vprob)
            jv = jacobian(x_hat, fv, vprob, free, bar)
            if bar is not None:
                bar.close()
            for local, run in enumerate(val):
                rows = vprob.row_run == local
                per_run[run.name] = _gn_step(jv[rows], fv[rows], res.x, typ, free, defs)
    if held:
        # Held values: the regression's, with the spread of one regression per run.
        for i in held:
            fitted[defs[i].name] = float(x0[i])
        regressed = [i for i in held if defs[i].name != LATENCY]
        if len(runs) >= 2 and regressed:
            for r in runs:
                one = effort_estimate(plant, [r], base, defs, tuple(opts.groups), latency0,
                                      opts.max_latency_s, drive, debias)
                row = per_run.setdefault(r.name, {})
                for i in regressed:
                    row[defs[i].name] = float(one.values.get(defs[i].name, x0[i]))
        if source == "probe" and LATENCY in fitted and dead is not None:
            # The probe's dead time per run: its spread is the run-to-run spread.
            for r in runs:
                if r.name in dead.per_run_s:
                    per_run.setdefault(r.name, {})[LATENCY] = dead.per_run_s[r.name]
                else:
                    per_run.get(r.name, {}).pop(LATENCY, None)
    spread: dict[str, float] = {}
    if len(per_run) >= 2:
        for name in fitted:
            vals = [v[name] for v in per_run.values() if name in v]
            if len(vals) >= 2:
                spread[name] = float(np.std(vals, ddof=1))

    held_out = val if val else train
    nominal = plant.resolved_params(PlantParams())
    err_nom, tr_nom = rollout_error(plant, held_out, nominal, 0.0, opts.rollout_s,
                                    opts.rollout_every_s, opts.max_latency_s, keep_traces=True)
    err_cal, tr_cal = rollout_error(plant, held_out, params_hat, latency_hat, opts.rollout_s,
                                    opts.rollout_every_s, opts.max_latency_s, keep_traces=True)
    say(f"held-out rollout RMS error: nominal {err_nom.rms_q_total_rad:.3g} rad, calibrated "
        f"{err_cal.rms_q_total_rad:.3g} rad")
    obs = [v for v in (observation_latency_s(r) for r in runs) if v is not None]
    return FitResult(
        joint_names=list(plant.joint_names),
        base_params=base,
        params=params_hat,
        action_latency_s=float(latency_hat),
        latency=lat,
        defs=defs,
        fitted=fitted,
        std=std,
        spread=spread,
        per_run=per_run,
        identifiability=ident,
        train_runs=[r.name for r in train],
        validation_runs=[r.name for r in val],
        in_sample_validation=not val,
        error_nominal=err_nom,
        error_calibrated=err_cal,
        noise=noise,
        observation_latency_s=float(np.median(obs)) if obs else None,
        cost_initial=cost0,
        cost_final=float(res.cost),
        evaluations=problem.evaluations + sub.evaluations,
        iterations=int(res.nfev),
        n_windows=len(windows),
        duration_s=time.monotonic() - t_start,
        traces={"nominal": tr_nom, "calibrated": tr_cal,
                "held_out_runs": [r.name for r in held_out]},
        effort_lag_s=effort_lag,
        effort_lag_scan=lag_scan,
        regression_nuisance=dict(warm.nuisance),
        latency_source=source,
        dead_time=dead.to_dict() if dead is not None else None,
    )


def _dead_time(runs: list[RunData], opts: FitOptions, use_tau: bool,
               say: Callable[[str], None]) -> tuple[str, DeadTimeEstimate | None]:
    """Resolve the latency source; read the probe's dead time where there is one."""
    probed = [r.name for r in runs
              if isinstance(r.metadata.get("excitation"), dict)
              and r.metadata["excitation"].get("latency_probe")]
    source = opts.latency_source
    if source == "auto":
        source = "probe" if probed else "fit"
    if source == "fit" and not probed:
        return "fit", None
    if not use_tau:
        if source == "probe":
            raise FitError("latency_source 'probe' reads the dead time on the drive torques; "
                           "the runs carry no efforts")
        return "fit", None
    try:
        dead = estimate_dead_time(runs, opts.max_latency_s)
    except DeadTimeError as exc:
        if source == "probe":
            raise FitError(f"latency probe: {exc}") from exc
        say(f"latency probe: {exc}")
        return "fit", None
    say(f"dead time at the latency probe: {dead.dead_time_s * 1e3:.2f} ms (median of "
        f"{dead.n_onsets} onsets, spread {dead.spread_s * 1e3:.2f} ms, standard error "
        f"{dead.stderr_s * 1e3:.2f} ms)" + ("" if source == "probe" else
                                           "; reported, the fit fits the latency"))
    return source, dead


@dataclass
class SolverResult:
    """What the least-squares solvers return (the fields of scipy's OptimizeResult we use)."""

    x: np.ndarray
    cost: float
    fun: np.ndarray
    jac: np.ndarray
    nfev: int
    status: int
    message: str


def levenberg_marquardt(
    fun: Callable[[np.ndarray], np.ndarray],
    jac: Callable[[np.ndarray], np.ndarray],
    z0: np.ndarray,
    lower: np.ndarray,
    upper: np.ndarray,
    max_iterations: int,
    lam0: float = 1e-3,
    tol: float = 1e-6,
) -> SolverResult:
    """Bounded Levenberg-Marquardt with Marquardt's diagonal scaling.

    Gauss-Newton steps are exact along the narrow valleys a stiff servo makes (gain vs
    damping), where a trust region started at |x0| first overshoots; the damping λ only grows
    when a step fails. Steps are projected onto the bounds. One Jacobian per iteration, and a
    failed trial costs one simulation.
    """
    z = np.clip(np.asarray(z0, dtype=float), lower, upper)
    f = fun(z)
    cost = 0.5 * float(f @ f)
    nfev = 1
    lam = lam0
    j = jac(z)
    status, message = 0, "the iteration limit was reached"
    for _ in range(max_iterations):
        jtj = j.T @ j
        g = j.T @ f
        d = np.maximum(np.diag(jtj), 1e-12)
        accepted = False
        for _trial in range(8):
            step = -np.linalg.solve(jtj + lam * np.diag(d), g)
            z_new = np.clip(z + step, lower, upper)
            f_new = fun(z_new)
            nfev += 1
            cost_new = 0.5 * float(f_new @ f_new)
            if cost_new < cost:
                accepted = True
                break
            lam *= 10.0
        if not accepted:
            status, message = 2, "no step reduces the cost (converged or stuck)"
            break
        rel = (cost - cost_new) / max(cost, 1e-300)
        dz = float(np.max(np.abs(z_new - z)))
        z, f, cost = z_new, f_new, cost_new
        lam = max(lam / 10.0, 1e-9)
        j = jac(z)
        if rel < 1e-8 or dz < tol:
            status, message = 1, "the cost or the parameters stopped changing"
            break
    return SolverResult(z, cost, f, j, nfev, status, message)


def _gn_step(
    j: np.ndarray, f: np.ndarray, z: np.ndarray, typ: np.ndarray, free: list[int],
    defs: list[ParamDef],
) -> dict[str, float]:
    """One damped Gauss-Newton step from the joint optimum using one run's residuals."""
    jtj = j.T @ j
    lam = 1e-6 * np.trace(jtj) / max(jtj.shape[0], 1)
    dz = -np.linalg.solve(jtj + lam * np.eye(jtj.shape[0]), j.T @ f)
    out = {}
    for c, i in enumerate(free):
        d = defs[i]
        out[d.name] = float(np.clip((z[c] + dz[c]) * typ[i], d.lower, d.upper))
    return out
