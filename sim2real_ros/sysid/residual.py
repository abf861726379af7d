"""Residual dynamics: a small torch model of (real next state - sim next state).

After calibration the simulator is right on average; what it still misses (unmodelled lag, gear
play, cable forces) is learned from the recorded runs as a correction of the state the sim
predicts one control period ahead. The sim core applies it with `correct_next_state`.

Samples: from a measured state (q, q̇) and the command in force, the calibrated plant is stepped
one control period (`horizon_s`); target = measured next state - simulated next state. Inputs
are the state, the command and the command-minus-position error, normalised by training
statistics stored with the weights.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from sim2real_ros.sim.plant import ArmPlant, PlantParams
from sim2real_ros.sysid.fit import make_windows
from sim2real_ros.sysid.runs import RunData
from sim2real_ros.sysid.shoot import simulate_segment, step_targets

FORMAT_VERSION = 1


@dataclass
class ResidualData:
    """Inputs (N, 4n), sim prediction (N, 2n), real next state (N, 2n), run index (N,)."""

    inputs: np.ndarray
    sim_next: np.ndarray
    real_next: np.ndarray
    run: np.ndarray


def features(q: np.ndarray, qd: np.ndarray, command: np.ndarray) -> np.ndarray:
    """Return the model inputs for states and commands (…, 4n)."""
    return np.concatenate([q, qd, command, command - q], axis=-1)


def collect(
    plant: ArmPlant,
    runs: list[RunData],
    params: PlantParams,
    latency_s: float,
    horizon_s: float = 0.01,
    every_s: float = 0.02,
) -> ResidualData:
    """Step the calibrated plant one horizon from measured states all along the runs."""
    plant.set_params(params)
    dt = plant.physics_dt_s
    windows = make_windows(runs, horizon_s, every_s, dt, 0.1)
    xs, sims, reals, run_idx = [], [], [], []
    for w in windows:
        run = runs[w.run]
        k_end = int(w.ks[-1])
        steps = np.array([int(w.steps[-1])])
        targets = step_targets(run.cmd_t_s, run.cmd, latency_s, run.t_s[w.k0], int(steps[0]), dt)
        seg = simulate_segment(plant, run.q[w.k0], run.qd[w.k0], targets, steps)
        u = run.command_at(np.array([run.t_s[w.k0]]), latency_s)[0]
        xs.append(features(run.q[w.k0], run.qd[w.k0], u))
        sims.append(np.concatenate([seg.q[-1], seg.qd[-1]]))
        reals.append(np.concatenate([run.q[k_end], run.qd[k_end]]))
        run_idx.append(w.run)
    if not xs:
        raise ValueError("no samples: runs too short or commands never move")
    return ResidualData(np.array(xs), np.array(sims), np.array(reals), np.array(run_idx))


class _MLP(nn.Module):
    def __init__(self, n_in: int, n_out: int, hidden: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(n_in, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
            nn.Linear(hidden, n_out),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class ResidualModel:
    """Predicts (real - sim) next state from state and command; normalised in and out."""

    def __init__(self, n_joints: int, hidden: int = 64, horizon_s: float = 0.01) -> None:
        self.n = n_joints
        self.hidden = hidden
        self.horizon_s = horizon_s
        self.net = _MLP(4 * n_joints, 2 * n_joints, hidden)
        self.x_mean = np.zeros(4 * n_joints)
        self.x_std = np.ones(4 * n_joints)
        self.y_mean = np.zeros(2 * n_joints)
        self.y_std = np.ones(2 * n_joints)
        self.meta: dict[str, Any] = {}

    def predict(self, inputs: np.ndarray) -> np.ndarray:
        """Return predicted residuals (…, 2n) for inputs (…, 4n)."""
        x = (np.asarray(inputs, dtype=float) - self.x_mean) / self.x_std
        with torch.no_grad():
            y = self.net(torch.as_tensor(x, dtype=torch.float32)).numpy()
        return y * self.y_std + self.y_mean

    def fit(
        self, data: ResidualData, epochs: int = 300, lr: float = 3e-3, seed: int = 0,
        weight_decay: float = 1e-4,
    ) -> list[float]:
        """Train on (inputs, real - sim) with full-batch Adam; return the loss history."""
        torch.manual_seed(seed)
        # A model this small trains fastest on one thread; torch's default pool of one thread a
        # core mostly synchronises (and competes with the simulator on a 2-core machine).
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return self._fit(data, epochs, lr, weight_decay)
        finally:
            torch.set_num_threads(threads)

    def _fit(self, data: ResidualData, epochs: int, lr: float, weight_decay: float) -> list[float]:
        y = data.real_next - data.sim_next
        self.x_mean, self.x_std = data.inputs.mean(0), data.inputs.std(0) + 1e-9
        self.y_mean, self.y_std = y.mean(0), y.std(0) + 1e-12
        x_t = torch.as_tensor((data.inputs - self.x_mean) / self.x_std, dtype=torch.float32)
        y_t = torch.as_tensor((y - self.y_mean) / self.y_std, dtype=torch.float32)
        opt = torch.optim.Adam(self.net.parameters(), lr=lr, weight_decay=weight_decay)
        history = []
        for _ in range(epochs):
            opt.zero_grad()
            loss = torch.mean((self.net(x_t) - y_t) ** 2)
            loss.backward()
            opt.step()
            history.append(float(loss.detach()))
        return history

    def save(self, path: str | Path) -> Path:
        """Write weights and normalisation to one file (torch.save of plain tensors)."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        blob = {
            "format_version": FORMAT_VERSION,
            "n_joints": self.n,
            "hidden": self.hidden,
            "horizon_s": self.horizon_s,
            "state_dict": self.net.state_dict(),
            "norm": {k: torch.as_tensor(getattr(self, k)) for k in
                     ("x_mean", "x_std", "y_mean", "y_std")},
            "meta": json.dumps(self.meta),
        }
        tmp = p.with_name(f".{p.name}.tmp")
        torch.save(blob, tmp)
        tmp.replace(p)
        return p

    @classmethod
    def load(cls, path: str | Path) -> ResidualModel:
        """Read a model written by save(); ValueError names what is wrong."""
        p = Path(path)
        try:
            blob = torch.load(p, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - any unreadable file is the same error here
            raise ValueError(f"{p}: not a residual model ({exc})") from exc
        if not isinstance(blob, dict) or blob.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"{p}: format_version {blob.get('format_version')!r} != "
                             f"{FORMAT_VERSION}")
        model = cls(int(blob["n_joints"]), int(blob["hidden"]), float(blob["horizon_s"]))
        model.net.load_state_dict(blob["state_dict"])
        for k, v in blob["norm"].items():
            setattr(model, k, v.numpy().astype(float))
        model.meta = json.loads(blob["meta"])
        return model


def correct_next_state(
    model: ResidualModel,
    q: np.ndarray,
    qd: np.ndarray,
    command: np.ndarray,
    q_next_sim: np.ndarray,
    qd_next_sim: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Return the sim's next state (one `model.horizon_s` ahead) plus the learned residual."""
    r = model.predict(features(np.asarray(q), np.asarray(qd), np.asarray(command)))
    n = model.n
    return np.asarray(q_next_sim) + r[..., :n], np.asarray(qd_next_sim) + r[..., n:]


@dataclass
class ResidualReport:
    """Held-out one-step error with and without the residual (RMS over joints and samples)."""

    rms_q_sim_rad: float
    rms_q_corrected_rad: float
    rms_qd_sim_rad_s: float
    rms_qd_corrected_rad_s: float
    n_train: int
    n_test: int

    @property
    def q_ratio(self) -> float:
        """Return sim error / corrected error for positions."""
        return self.rms_q_sim_rad / max(self.rms_q_corrected_rad, 1e-15)


def evaluate(model: ResidualModel, data: ResidualData) -> tuple[float, float, float, float]:
    """Return RMS (q sim, q corrected, q̇ sim, q̇ corrected) errors on data."""
    n = model.n
    corr = data.sim_next + model.predict(data.inputs)
    e_sim = data.real_next - data.sim_next
    e_cor = data.real_next - corr
    return (float(np.sqrt(np.mean(e_sim[:, :n] ** 2))), float(np.sqrt(np.mean(e_cor[:, :n] ** 2))),
            float(np.sqrt(np.mean(e_sim[:, n:] ** 2))), float(np.sqrt(np.mean(e_cor[:, n:] ** 2))))


def train_residual(
    plant: ArmPlant,
    train: list[RunData],
    test: list[RunData],
    params: PlantParams,
    latency_s: float,
    horizon_s: float = 0.01,
    every_s: float = 0.02,
    epochs: int = 300,
    seed: int = 0,
) -> tuple[ResidualModel, ResidualReport]:
    """Collect samples, train on `train` runs, report the held-out error on `test` runs."""
    d_train = collect(plant, train, params, latency_s, horizon_s, every_s)
    d_test = collect(plant, test, params, latency_s, horizon_s, every_s)
    model = ResidualModel(plant.n, horizon_s=horizon_s)
    model.fit(d_train, epochs=epochs, seed=seed)
    qs, qc, vs, vc = evaluate(model, d_test)
    model.meta = {"train_runs": [r.name for r in train], "test_runs": [r.name for r in test],
                  "latency_s": latency_s, "joint_names": plant.joint_names,
                  "held_out_rms_q_sim_rad": qs, "held_out_rms_q_corrected_rad": qc}
    return model, ResidualReport(qs, qc, vs, vc, len(d_train.inputs), len(d_test.inputs))
