"""Dead time of the command path, read on the drive torque at moves that start from rest.

The simulation fit's action latency is the dead time *as the simulator's drive sees it*: where
the unit's drive has integral action and the simulator's is a PD, the fitted latency absorbs the
drive's phase lag (docs/sysid.md, known limits). A move that starts from rest fixes the dead time
without a drive model: until the first command of the move reaches the drive, the drive's torque
follows its hold; from then on it follows the command. The recorder appends such moves to an
excitation (`excitation.append_latency_probe`); this module finds them in a run and reads the
dead time off the measured efforts.

Per onset and joint, the measured torque's time integral over a window around the onset is
regressed on the integral of the command delayed by d, on the joint's displacement and its
integral (from the measured velocity; a drive's P and D terms act on them) and on a cubic in time
(the hold's slow trends); d is scanned on a grid. The integral is what makes this work under bus
jitter: the torque steps a 100 Hz command staircase causes are ambiguous modulo the command
period and a few ms of jitter scramble them, while their integral depends on each step's timing
only through its own small area. The joints of one onset share its commands, hence its delays:
their costs add, and one dead time comes out per onset. The estimate is the median over onsets.

Only onsets that start in the direction the joint's previous move ended in count: a move that
reverses first crosses the gearbox's backlash, which the drive sees as extra delay.

Efforts must be aligned to their stamps first (`regression.align_effort` with the fit's effort
lag): a drive that reports the mean torque of its period otherwise reads half a period late.
Pure numpy; the fit (`fit.FitOptions.latency_source`) and the report use it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sim2real_ros.sysid.runs import RunData

MIN_REST_S = 0.3  # a probe move starts after at least this long without command motion
MOVE_TOL_RAD = 1e-7  # a command change smaller than this is no motion
PRE_S = 0.1  # window before the onset (the hold's trend)
POST_S = 0.04  # window after the latest dead time scanned
GRID_S = 0.0005  # dead-time grid
MIN_RESPONSE = 0.5  # the command term must explain at least half the window's variance
MIN_ONSETS = 4  # fewer usable onsets: no estimate
MIN_RUN_ONSETS = 3  # a run's own median (its run-to-run spread) needs this many


class DeadTimeError(ValueError):
    """No dead time can be read from these runs; the message says why."""


@dataclass(frozen=True)
class Onset:
    """One probe onset: the first command of a move from rest, on the joints that moved."""

    run: str
    t_s: float  # stamp of the move's first command (run time)
    index: int  # its index in run.cmd
    joints: tuple[int, ...]  # joints whose move continues their previous direction


@dataclass
class OnsetEstimate:
    """The dead time read at one onset."""

    onset: Onset
    dead_time_s: float
    joints_used: tuple[int, ...]
    cost: np.ndarray  # normalised cost over the grid (summed over joints_used)


@dataclass
class DeadTimeEstimate:
    """Dead time of the command path from probe onsets (median over onsets)."""

    dead_time_s: float
    spread_s: float  # robust standard deviation of the per-onset values (1.4826 x MAD)
    stderr_s: float  # standard error of the median (1.2533 x spread / sqrt(n))
    per_run_s: dict[str, float]  # median per run (runs with >= MIN_RUN_ONSETS onsets)
    onsets: list[OnsetEstimate] = field(default_factory=list)
    grid_s: np.ndarray = field(default_factory=lambda: np.zeros(0))
    skipped: list[str] = field(default_factory=list)  # onsets left out, and why

    @property
    def n_onsets(self) -> int:
        """Return the number of onsets the estimate is the median of."""
        return len(self.onsets)

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-friendly summary (report, calibration)."""
        return {
            "dead_time_s": float(self.dead_time_s),
            "spread_s": float(self.spread_s),
            "stderr_s": float(self.stderr_s),
            "n_onsets": self.n_onsets,
            "per_run_s": {k: float(v) for k, v in self.per_run_s.items()},
            "onsets": [{"run": e.onset.run, "t_s": round(e.onset.t_s, 4),
                        "dead_time_s": float(e.dead_time_s),
                        "joints": list(e.joints_used)} for e in self.onsets],
            "skipped": list(self.skipped),
        }


def find_onsets(run: RunData, min_rest_s: float = MIN_REST_S,
                tol_rad: float = MOVE_TOL_RAD) -> list[Onset]:
    """Moves that start after `min_rest_s` of still commands, per command index.

    A joint counts at an onset when its move starts in the direction its previous move ended
    in (the gearbox's backlash is taken up on that side). Joints that start together share an
    onset.
    """
    cmd, t = run.cmd, run.cmd_t_s
    if cmd.shape[0] < 3:
        return []
    moving = np.abs(np.diff(cmd, axis=0)) > tol_rad  # row i: command i+1 differs from i
    any_moving = moving.any(axis=1)
    found: dict[int, list[int]] = {}
    for j in range(cmd.shape[1]):
        m = moving[:, j]
        last_dir = 0.0
        i = 0
        n = m.size
        while i < n:
            if not m[i]:
                i += 1
                continue
            end = i
            while end < n and m[end]:
                end += 1
            # A move starts in the direction of its first change and leaves the gearbox
            # loaded in the direction of its last: a command that overshoots and creeps back
            # (a filter trimming the reference) ends the other way.
            steps = np.diff(cmd[i:end + 1, j])
            direction = float(np.sign(steps[0]))
            final = float(np.sign(steps[-1]))
            # still: no joint's command moved for min_rest_s before this move
            k = i
            while k > 0 and not any_moving[k - 1]:
                k -= 1
            rest = t[i] - t[k] if k > 0 else t[i] - t[0]
            if rest >= min_rest_s and direction != 0.0 and direction == last_dir:
                found.setdefault(i + 1, []).append(j)
            last_dir = final
            i = end
    return [Onset(run.name, float(t[idx]), idx, tuple(sorted(js)))
            for idx, js in sorted(found.items())]


def _cumtrapz(y: np.ndarray, t: np.ndarray) -> np.ndarray:
    out = np.zeros(y.size)
    out[1:] = np.cumsum(0.5 * (y[1:] + y[:-1]) * np.diff(t))
    return out


def _staircase_integral(run: RunData, j: int, c0: float) -> tuple[np.ndarray, np.ndarray]:
    """Breakpoints (times, values) of F(s) = integral of (command_j - c0) up to s.

    The command holds each value from its stamp to the next (zero-order hold): F is piecewise
    linear with its breakpoints at the stamps, exact for any delay.
    """
    t = run.cmd_t_s
    v = run.cmd[:, j] - c0
    F = np.concatenate([[0.0], np.cumsum(v[:-1] * np.diff(t))])
    # extend past the last command with its value held for a long time
    t_ext = np.concatenate([t, [t[-1] + 1e3]])
    F_ext = np.concatenate([F, [F[-1] + v[-1] * 1e3]])
    return t_ext, F_ext


def _onset_cost(run: RunData, onset: Onset, j: int, grid: np.ndarray,
                pre_s: float, post_s: float) -> tuple[np.ndarray, float] | None:
    """Residual sum of squares over the grid for one joint, and the command term's share."""
    assert run.tau is not None
    t0 = onset.t_s - pre_s
    k = np.flatnonzero((run.t_s > t0) & (run.t_s <= onset.t_s + grid[-1] + post_s))
    if k.size < 12:
        return None
    tk = run.t_s[k]
    y = _cumtrapz(run.tau[k, j], tk)
    qd = run.qd[k, j]
    q1 = _cumtrapz(qd, tk)  # displacement since the window's start
    q2 = _cumtrapz(q1, tk)
    x = (tk - onset.t_s) / (pre_s + post_s)  # scaled: a well-conditioned cubic
    base = np.column_stack([np.ones(k.size), x, x * x, x ** 3, q1, q2])
    c0 = float(run.cmd[onset.index - 1, j])
    bt, bF = _staircase_integral(run, j, c0)
    # the regression without the command: what the command term must add to
    sol0, *_ = np.linalg.lstsq(base, y, rcond=None)
    r0 = y - base @ sol0
    ss0 = float(r0 @ r0)
    costs = np.empty(grid.size)
    for a, d in enumerate(grid):
        U = np.interp(tk - d, bt, bF, left=0.0) - np.interp(t0 - d, bt, bF, left=0.0)
        X = np.column_stack([base, U])
        sol, *_ = np.linalg.lstsq(X, y, rcond=None)
        r = y - X @ sol
        costs[a] = float(r @ r)
    share = 1.0 - float(costs.min()) / ss0 if ss0 > 0 else 0.0
    return costs, share


def estimate_dead_time(
    runs: list[RunData],
    max_latency_s: float = 0.1,
    grid_s: float = GRID_S,
    pre_s: float = PRE_S,
    post_s: float = POST_S,
    min_onsets: int = MIN_ONSETS,
) -> DeadTimeEstimate:
    """Median dead time over the probe onsets of `runs` (efforts aligned to their stamps).

    Raises DeadTimeError when the runs carry no efforts or fewer than `min_onsets` usable
    onsets (record with a latency probe: `sim2real sysid excite --latency-probe N`).
    """
    if not (math.isfinite(max_latency_s) and 0.0 < max_latency_s <= 0.5):
        raise DeadTimeError(f"max_latency_s = {max_latency_s}: expected (0, 0.5] s")
    if not (0.0 < grid_s <= 0.005):
        raise DeadTimeError(f"grid_s = {grid_s}: expected (0, 0.005] s")
    if any(r.tau is None for r in runs):
        raise DeadTimeError("the dead time is read on the drive torques; a run has no efforts")
    grid = np.arange(0.0, max_latency_s + 0.5 * grid_s, grid_s)
    estimates: list[OnsetEstimate] = []
    skipped: list[str] = []
    found = 0
    for r in runs:
        for onset in find_onsets(r):
            found += 1
            if onset.t_s - pre_s < r.t_s[0] or onset.t_s + grid[-1] + post_s > r.t_s[-1]:
                skipped.append(f"{r.name} t={onset.t_s:.2f} s: too close to the run's end")
                continue
            total = np.zeros(grid.size)
            used = []
            for j in onset.joints:
                res = _onset_cost(r, onset, j, grid, pre_s, post_s)
                if res is None:
                    continue
                costs, share = res
                if share < MIN_RESPONSE or not costs.min() > 0:
                    continue
                total += costs / costs.min()
                used.append(j)
            if not used:
                skipped.append(f"{r.name} t={onset.t_s:.2f} s: no joint's torque followed "
                               "the command")
                continue
            a = int(np.argmin(total))
            d = float(grid[a])
            if 0 < a < grid.size - 1:
                # parabola through the minimum and its neighbours
                c_m, c_0, c_p = total[a - 1], total[a], total[a + 1]
                den = c_m - 2.0 * c_0 + c_p
                if den > 0:
                    d += 0.5 * grid_s * (c_m - c_p) / den
            estimates.append(OnsetEstimate(onset, d, tuple(used), total / len(used)))
    if len(estimates) < min_onsets:
        raise DeadTimeError(
            f"{len(estimates)} usable probe onsets in {len(runs)} runs ({found} found; "
            f"expected >= {min_onsets}): record the runs with a latency probe "
            "(`sim2real sysid excite --latency-probe 12`)"
            + (f"; left out: {'; '.join(skipped[:5])}" if skipped else ""))
    values = np.array([e.dead_time_s for e in estimates])
    med = float(np.median(values))
    spread = float(1.4826 * np.median(np.abs(values - med)))
    per_run: dict[str, float] = {}
    for r in runs:
        v = [e.dead_time_s for e in estimates if e.onset.run == r.name]
        # One start's value is no run's dead time (run 28's held fourth run read 42 ms on
        # its only one); its spread would set the randomization's delay range.
        if len(v) >= MIN_RUN_ONSETS:
            per_run[r.name] = float(np.median(v))
    return DeadTimeEstimate(
        dead_time_s=med,
        spread_s=spread,
        stderr_s=float(1.2533 * spread / math.sqrt(len(estimates))),
        per_run_s=per_run,
        onsets=estimates,
        grid_s=grid,
        skipped=skipped,
    )
