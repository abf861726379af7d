"""One identification run as arrays: measured joint states, commands as sent, F/T, noise at rest.

A run comes from a bag (`load_run`) or from the simulator (`synth.synthesize_run`); everything
downstream (latency, fit, residual model, report) takes `RunData` and never touches bag files.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sim2real_ros.sysid import bags

MIN_SAMPLES = 200  # below this a run cannot carry a fit window, let alone several


class RunError(ValueError):
    """A run's data cannot be used; the message names the run and what is wrong."""


@dataclass
class NoiseProfile:
    """Sensor noise measured while the arm is at rest (standard deviations)."""

    joint_position_std_rad: np.ndarray
    joint_velocity_std_rad_s: np.ndarray
    joint_effort_std_nm: np.ndarray | None
    ft_force_std_n: float | None
    ft_torque_std_nm: float | None
    rest_samples: int

    def to_dict(self) -> dict[str, Any]:
        """Return the YAML layout of the calibration's `noise` section."""
        out: dict[str, Any] = {
            "joint_position_std_rad": [float(v) for v in self.joint_position_std_rad],
            "joint_velocity_std_rad_s": [float(v) for v in self.joint_velocity_std_rad_s],
            "rest_samples": int(self.rest_samples),
        }
        if self.joint_effort_std_nm is not None:
            out["joint_effort_std_nm"] = [float(v) for v in self.joint_effort_std_nm]
        if self.ft_force_std_n is not None:
            out["ft_force_std_n"] = float(self.ft_force_std_n)
        if self.ft_torque_std_nm is not None:
            out["ft_torque_std_nm"] = float(self.ft_torque_std_nm)
        return out


@dataclass
class RunData:
    """One run; all times in seconds from the run's first joint state stamp."""

    name: str
    joint_names: list[str]
    t_s: np.ndarray  # (T,) measurement stamps
    q: np.ndarray  # (T, n) rad
    qd: np.ndarray  # (T, n) rad/s
    tau: np.ndarray | None  # (T, n) N·m, None if the arm reports no effort
    cmd_t_s: np.ndarray  # (C,) when each command was sent
    cmd: np.ndarray  # (C, n) target positions, rad
    recv_t_s: np.ndarray | None = None  # (T,) when the recorder received each joint state
    wrench_t_s: np.ndarray | None = None
    wrench: np.ndarray | None = None  # (W, 6)
    metadata: dict[str, Any] = field(default_factory=dict)
    t0_abs_s: float = 0.0  # absolute stamp of t_s == 0

    @property
    def n_joints(self) -> int:
        """Return the number of joints."""
        return len(self.joint_names)

    @property
    def unit_serial(self) -> str:
        """Return the unit serial this run was recorded on ('' if unknown)."""
        return str(self.metadata.get("unit", {}).get("serial", ""))

    @property
    def sample_period_s(self) -> float:
        """Return the median joint-state period."""
        return float(np.median(np.diff(self.t_s)))

    def command_at(self, t_s: np.ndarray, latency_s: float = 0.0) -> np.ndarray:
        """Return the command in force at each time (zero-order hold, delayed by latency)."""
        idx = np.searchsorted(self.cmd_t_s + latency_s, t_s, side="right") - 1
        return self.cmd[np.clip(idx, 0, self.cmd.shape[0] - 1)]

    def validate(self) -> None:
        """Raise RunError for too little data, non-finite values or non-monotonic time."""
        n = self.n_joints
        if self.t_s.size < MIN_SAMPLES:
            raise RunError(f"{self.name}: {self.t_s.size} joint states, need >= {MIN_SAMPLES}")
        if self.cmd_t_s.size < 2:
            raise RunError(f"{self.name}: {self.cmd_t_s.size} commands, need >= 2")
        arrays: list[tuple[str, np.ndarray | None]] = [
            ("position", self.q), ("velocity", self.qd), ("effort", self.tau),
            ("command", self.cmd),
        ]
        for label, arr in arrays:
            if arr is None:
                continue
            if arr.ndim != 2 or arr.shape[1] != n:
                raise RunError(f"{self.name}: {label} has shape {arr.shape}, expected (*, {n})")
            bad = ~np.isfinite(arr)
            if bad.any():
                row = int(np.argwhere(bad)[0][0])
                raise RunError(f"{self.name}: non-finite {label} at sample {row}")
        if np.any(np.diff(self.t_s) <= 0):
            k = int(np.flatnonzero(np.diff(self.t_s) <= 0)[0])
            raise RunError(
                f"{self.name}: joint_states stamps not increasing at sample {k} "
                f"({self.t_s[k]:.6f} -> {self.t_s[k + 1]:.6f} s)"
            )

    def slice_time(self, start_s: float, stop_s: float) -> RunData:
        """Return the part of the run between two times (commands kept from just before)."""
        m = (self.t_s >= start_s) & (self.t_s < stop_s)
        c0 = max(int(np.searchsorted(self.cmd_t_s, start_s, side="right")) - 1, 0)
        cm = np.arange(self.cmd_t_s.size) >= c0
        cm &= self.cmd_t_s < stop_s
        return RunData(
            self.name, self.joint_names, self.t_s[m], self.q[m], self.qd[m],
            None if self.tau is None else self.tau[m], self.cmd_t_s[cm], self.cmd[cm],
            None if self.recv_t_s is None else self.recv_t_s[m], self.wrench_t_s, self.wrench,
            self.metadata, self.t0_abs_s,
        )


def load_run(
    bag_path: str | Path,
    joint_names: list[str],
    joint_states_topic: str = bags.JOINT_STATES,
    command_topic: str = bags.POSITION_COMMANDS,
    wrench_topic: str | None = bags.WRENCH,
) -> RunData:
    """Read one recorded run from a bag; BagError/RunError say what is missing or wrong."""
    p = Path(bag_path)
    info = bags.bag_info(p)
    if info.status != bags.STATUS_COMPLETE and info.status != "unknown":
        raise RunError(f"{p}: the recording did not complete ({info.status})")
    js = bags.read_joint_states(p, joint_names, joint_states_topic)
    if js.velocity is None:
        raise RunError(f"{p}: {joint_states_topic} carries no velocities")
    cmds = bags.read_position_commands(p, len(joint_names), command_topic)
    wrench = None
    wrench_t = None
    if wrench_topic is not None:
        try:
            w = bags.read_wrench(p, wrench_topic)
            wrench, wrench_t = w.wrench, w.t_s
        except bags.BagError:
            wrench = None  # an arm without F/T still identifies; noise just lacks F/T
    t0 = float(js.t_s[0])
    run = RunData(
        name=p.name,
        joint_names=list(joint_names),
        t_s=js.t_s - t0,
        q=js.position,
        qd=js.velocity,
        tau=js.effort,
        cmd_t_s=cmds.t_s - t0,
        cmd=cmds.values,
        recv_t_s=js.recv_t_s - t0,
        wrench_t_s=None if wrench_t is None else wrench_t - t0,
        wrench=wrench,
        metadata=info.metadata,
        t0_abs_s=t0,
    )
    try:
        run.validate()
    except RunError as exc:
        raise RunError(f"{p}: {exc}") from exc
    return run


def check_same_unit(runs: list[RunData]) -> str:
    """Return the unit serial all runs share; RunError if they name different units."""
    serials = {r.name: r.unit_serial for r in runs}
    distinct = sorted(set(serials.values()))
    if len(distinct) > 1:
        raise RunError(f"runs come from different units: {serials}; fit one unit at a time")
    return distinct[0] if distinct else ""


def rest_mask(run: RunData, settle_s: float = 0.5, min_rest_s: float = 0.5) -> np.ndarray:
    """Return a mask of samples where the command has been constant for at least settle_s."""
    changes = np.flatnonzero(np.any(np.abs(np.diff(run.cmd, axis=0)) > 1e-9, axis=1)) + 1
    change_t = run.cmd_t_s[changes] if changes.size else np.zeros(0)
    # time since the last command change (or since the first command)
    starts = np.concatenate([[run.cmd_t_s[0]], change_t])
    idx = np.searchsorted(starts, run.t_s, side="right") - 1
    since = np.where(idx >= 0, run.t_s - starts[np.clip(idx, 0, None)], -1.0)
    nxt = np.concatenate([starts[1:], [np.inf]])
    until = nxt[np.clip(idx, 0, None)] - run.t_s
    mask = (idx >= 0) & (since >= settle_s) & (until > 0.0)
    # a rest stretch must last min_rest_s beyond the settling time
    seg_len = (nxt - starts)[np.clip(idx, 0, None)]
    return mask & (seg_len >= settle_s + min_rest_s)


def estimate_noise(runs: list[RunData]) -> NoiseProfile | None:
    """Measure sensor noise in the runs' rest stretches; None if there is no rest."""
    qs, qds, taus, forces, torques = [], [], [], [], []
    total = 0
    for run in runs:
        m = rest_mask(run)
        if m.sum() < 50:
            continue
        total += int(m.sum())
        # Contiguous stretches are detrended separately so a slow settling drift is not noise.
        edges = np.flatnonzero(np.diff(m.astype(int)) != 0) + 1
        for seg in np.split(np.arange(m.size), edges):
            if seg.size < 20 or not m[seg[0]]:
                continue
            qs.append(_detrend(run.q[seg]))
            qds.append(run.qd[seg] - run.qd[seg].mean(axis=0))
            if run.tau is not None:
                taus.append(_detrend(run.tau[seg]))
            if run.wrench is not None and run.wrench_t_s is not None:
                wm = (run.wrench_t_s >= run.t_s[seg[0]]) & (run.wrench_t_s <= run.t_s[seg[-1]])
                if wm.sum() >= 20:
                    w = _detrend(run.wrench[wm])
                    forces.append(w[:, :3])
                    torques.append(w[:, 3:])
    if not qs:
        return None
    return NoiseProfile(
        joint_position_std_rad=np.vstack(qs).std(axis=0),
        joint_velocity_std_rad_s=np.vstack(qds).std(axis=0),
        joint_effort_std_nm=np.vstack(taus).std(axis=0) if taus else None,
        ft_force_std_n=float(np.vstack(forces).std()) if forces else None,
        ft_torque_std_nm=float(np.vstack(torques).std()) if torques else None,
        rest_samples=total,
    )


def _detrend(x: np.ndarray) -> np.ndarray:
    t = np.linspace(-1.0, 1.0, x.shape[0])
    a = np.vstack([np.ones_like(t), t]).T
    coef, *_ = np.linalg.lstsq(a, x, rcond=None)
    return x - a @ coef


def observation_latency_s(run: RunData) -> float | None:
    """Return the median age of a joint state when the recorder got it (receive - stamp)."""
    if run.recv_t_s is None:
        return None
    return float(np.median(run.recv_t_s - run.t_s))
