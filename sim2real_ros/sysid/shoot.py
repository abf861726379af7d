"""Replay recorded commands through the sim plant over short windows (multiple shooting).

A command sent at t reaches the drive at t + latency and is held until the next one (zero-order
hold). The plant steps at a fixed physics period, so each step gets the command averaged over
that step: the replay is then continuous in the latency, which lets a least-squares fitter move
the latency by fractions of a step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim2real_ros.sim.plant import ArmPlant


def step_targets(
    cmd_t_s: np.ndarray,
    cmd: np.ndarray,
    latency_s: float,
    t_start_s: float,
    n_steps: int,
    dt_s: float,
    before: np.ndarray | None = None,
) -> np.ndarray:
    """Return (n_steps, n) targets: the delayed zero-order-hold command averaged over each step.

    `before` is the value held before the first command arrives (default: the first command).
    """
    edges = np.asarray(cmd_t_s, dtype=float) + float(latency_s)
    vals = np.asarray(cmd, dtype=float)
    first = vals[0] if before is None else np.asarray(before, dtype=float)
    # U(t) = ∫ u dt from edges[0]; piecewise linear, so step averages are exact.
    seg = np.diff(edges)[:, None] * vals[:-1]
    cum = np.vstack([np.zeros((1, vals.shape[1])), np.cumsum(seg, axis=0)])

    def integral(t: np.ndarray) -> np.ndarray:
        i = np.searchsorted(edges, t, side="right") - 1
        out = np.empty((t.size, vals.shape[1]))
        pre = i < 0
        ic = np.clip(i, 0, None)
        out[~pre] = cum[ic[~pre]] + vals[ic[~pre]] * (t[~pre] - edges[ic[~pre]])[:, None]
        out[pre] = first * (t[pre] - edges[0])[:, None]
        return out

    taus = t_start_s + dt_s * np.arange(n_steps + 1)
    u = integral(taus)
    out = (u[1:] - u[:-1]) / dt_s
    # Steps without an edge get the held value exactly (not a rounded difference), so runs of
    # equal targets can be stepped in one call.
    i = np.searchsorted(edges, taus, side="right") - 1
    inside = i[:-1] == i[1:]
    held = np.where((i[:-1] < 0)[:, None], first, vals[np.clip(i[:-1], 0, None)])
    out[inside] = held[inside]
    return out


@dataclass
class Segment:
    """Simulated samples of one window: states after `sample_steps` physics steps."""

    q: np.ndarray
    qd: np.ndarray
    tau: np.ndarray
    wrench: np.ndarray | None = None


def simulate_segment(
    plant: ArmPlant,
    q0: np.ndarray,
    qd0: np.ndarray,
    targets: np.ndarray,
    sample_steps: np.ndarray,
    record_wrench: bool = False,
) -> Segment:
    """Reset the plant to (q0, qd0), apply one target per physics step, sample the states."""
    plant.reset(q0, qd0)
    n = plant.n
    m = len(sample_steps)
    out_q = np.empty((m, n))
    out_qd = np.empty((m, n))
    out_tau = np.empty((m, n))
    out_w = np.empty((m, 6)) if record_wrench else None
    changed = np.ones(targets.shape[0], dtype=bool)
    changed[1:] = np.any(targets[1:] != targets[:-1], axis=1)
    change_idx = np.flatnonzero(changed)
    j = 0
    ci = 0
    for k, s in enumerate(sample_steps):
        s = int(s)
        while j < s:
            while ci < change_idx.size and change_idx[ci] <= j:
                ci += 1
            nxt = min(s, int(change_idx[ci]) if ci < change_idx.size else s)
            plant.set_command("position", targets[j])
            plant.advance_steps(nxt - j)
            j = nxt
        st = plant.state()
        out_q[k] = st.q
        out_qd[k] = st.qd
        out_tau[k] = st.tau_nm
        if out_w is not None:
            out_w[k] = st.wrench
    return Segment(out_q, out_qd, out_tau, out_w)
