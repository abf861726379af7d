"""A learned world model as a second simulator for checking, never the only one.

An ensemble of small MLPs learns the one-step dynamics (state, action) -> next state from
recorded transitions (bags of the real cell, or arrays). Each member sees its own bootstrap
resample and its own initialisation, so the members agree where data pin them down and
disagree away from it. SiLU hidden units extrapolate roughly linearly with member-specific
slopes, so the disagreement keeps growing with the distance from the data (tanh members
saturate and agree again far out; we measured both). That disagreement marks states outside
the data, where the model must not be trusted: learned dynamics fail silently (incoherent
rather than divergent) where data are sparse.

The consistency check rolls a policy out in the calibrated simulator and in the world model
from the same starts, reports their divergence, and flags the visited states where the two
disagree beyond a threshold, or where the world model is outside its data.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from sim2real_ros.audit.evidence import WorldModelSummary

FORMAT = "sim2real_worldmodel/1"


@dataclass
class Transitions:
    """One-step transitions: state (N, ds), action (N, da), next_state (N, ds)."""

    state: np.ndarray
    action: np.ndarray
    next_state: np.ndarray

    def __post_init__(self) -> None:
        self.state = np.asarray(self.state, dtype=float)
        self.action = np.asarray(self.action, dtype=float)
        self.next_state = np.asarray(self.next_state, dtype=float)
        if self.state.ndim != 2 or self.action.ndim != 2 or self.next_state.ndim != 2:
            raise ValueError("state, action and next_state must be 2-D arrays (N, dim)")
        n = self.state.shape[0]
        if self.action.shape[0] != n or self.next_state.shape != self.state.shape:
            raise ValueError(
                f"expected state (N, ds), action (N, da), next_state (N, ds) with one N; got "
                f"{self.state.shape}, {self.action.shape}, {self.next_state.shape}")
        if n == 0:
            raise ValueError("no transitions")
        for name in ("state", "action", "next_state"):
            if not np.all(np.isfinite(getattr(self, name))):
                raise ValueError(f"{name} has non-finite values")

    def __len__(self) -> int:
        return int(self.state.shape[0])

    @classmethod
    def concat(cls, parts: Sequence[Transitions]) -> Transitions:
        """Join several sets (e.g. one per bag)."""
        return cls(np.vstack([p.state for p in parts]), np.vstack([p.action for p in parts]),
                   np.vstack([p.next_state for p in parts]))


@dataclass(frozen=True)
class WorldModelConfig:
    """Ensemble size, network shape and training schedule (all seeded)."""

    members: int = 5
    hidden: tuple[int, ...] = (64, 64)
    epochs: int = 150
    batch_size: int = 256
    learning_rate: float = 3e-3
    weight_decay: float = 1e-5
    # A state is outside the data when its disagreement exceeds this multiple of the 99th
    # percentile of the disagreement on the training transitions.
    ood_margin: float = 2.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.members < 2:
            raise ValueError(f"an ensemble needs >= 2 members, got {self.members}")
        if self.epochs < 1 or self.batch_size < 1 or not self.hidden:
            raise ValueError("epochs, batch_size and hidden must be positive")


class _Ensemble(nn.Module):
    """K MLPs evaluated together: one batched matrix product per layer."""

    def __init__(self, k: int, sizes: list[int], gen: torch.Generator) -> None:
        super().__init__()
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for a, b in zip(sizes[:-1], sizes[1:], strict=True):
            self.weights.append(nn.Parameter(torch.randn(k, a, b, generator=gen) / math.sqrt(a)))
            self.biases.append(nn.Parameter(torch.zeros(k, 1, b)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (K, B, in) -> (K, B, out)."""
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
            x = torch.baddbmm(b, x, w)
            if i < last:
                x = torch.nn.functional.silu(x)
        return x


@dataclass
class _Norm:
    mean: np.ndarray
    std: np.ndarray

    @classmethod
    def of(cls, x: np.ndarray, floor: float = 1e-6) -> _Norm:
        return cls(x.mean(axis=0), np.maximum(x.std(axis=0), floor))


@dataclass
class FitReport:
    """Training outcome: final loss and one-step RMS error per state dimension (held-out)."""

    final_loss: float
    heldout_rms: np.ndarray
    train_rms: np.ndarray
    ood_threshold: float
    n_train: int
    n_heldout: int


class EnsembleWorldModel:
    """Learned one-step dynamics with an ensemble disagreement score."""

    def __init__(self, state_dim: int, action_dim: int, cfg: WorldModelConfig | None = None
                 ) -> None:
        self.cfg = cfg or WorldModelConfig()
        self.state_dim = state_dim
        self.action_dim = action_dim
        gen = torch.Generator().manual_seed(self.cfg.seed)
        sizes = [state_dim + action_dim, *self.cfg.hidden, state_dim]
        self.net = _Ensemble(self.cfg.members, sizes, gen)
        self.in_norm = _Norm(np.zeros(state_dim + action_dim), np.ones(state_dim + action_dim))
        self.out_norm = _Norm(np.zeros(state_dim), np.ones(state_dim))
        self.ood_threshold = math.inf
        self.fit_report: FitReport | None = None

    # -- training -----------------------------------------------------------------------------

    @classmethod
    def fit(cls, data: Transitions, cfg: WorldModelConfig | None = None,
            heldout_fraction: float = 0.2) -> EnsembleWorldModel:
        """Train a new ensemble on `data` (seeded); hold out a fraction to report its error."""
        cfg = cfg or WorldModelConfig()
        model = cls(data.state.shape[1], data.action.shape[1], cfg)
        rng = np.random.default_rng(cfg.seed)
        n = len(data)
        perm = rng.permutation(n)
        n_held = int(round(heldout_fraction * n)) if n >= 10 else 0
        held, train = perm[:n_held], perm[n_held:]
        x = np.hstack([data.state, data.action])
        y = data.next_state - data.state  # predict the change: well scaled, identity is free
        model.in_norm = _Norm.of(x[train])
        model.out_norm = _Norm.of(y[train])
        xt = torch.as_tensor((x - model.in_norm.mean) / model.in_norm.std, dtype=torch.float32)
        yt = torch.as_tensor((y - model.out_norm.mean) / model.out_norm.std, dtype=torch.float32)
        k = cfg.members
        # Each member trains on its own bootstrap resample of the training indices.
        boot = torch.as_tensor(rng.choice(train, size=(k, train.size), replace=True))
        opt = torch.optim.Adam(model.net.parameters(), lr=cfg.learning_rate,
                               weight_decay=cfg.weight_decay)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=cfg.epochs)
        gen = torch.Generator().manual_seed(cfg.seed + 1)
        bs = min(cfg.batch_size, train.size)
        loss_value = math.nan
        for _ in range(cfg.epochs):
            order = torch.stack([torch.randperm(train.size, generator=gen) for _ in range(k)])
            for start in range(0, train.size, bs):
                idx = torch.gather(boot, 1, order[:, start:start + bs])  # (K, B)
                pred = model.net(xt[idx])
                loss = ((pred - yt[idx]) ** 2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                loss_value = float(loss.detach())
            sched.step()
        train_dis = model.disagreement(data.state[train], data.action[train])
        model.ood_threshold = float(np.percentile(train_dis, 99) * cfg.ood_margin)

        def rms(ix: np.ndarray) -> np.ndarray:
            if ix.size == 0:
                return np.full(model.state_dim, math.nan)
            pred, _ = model.predict(data.state[ix], data.action[ix])
            return np.sqrt(np.mean((pred - data.next_state[ix]) ** 2, axis=0))

        model.fit_report = FitReport(loss_value, rms(held), rms(train), model.ood_threshold,
                                     int(train.size), int(held.size))
        return model

    # -- prediction ---------------------------------------------------------------------------

    def members(self, state: np.ndarray, action: np.ndarray) -> np.ndarray:
        """Return every member's next-state prediction, (K, N, ds)."""
        s = np.atleast_2d(np.asarray(state, dtype=float))
        a = np.atleast_2d(np.asarray(action, dtype=float))
        if s.shape[1] != self.state_dim or a.shape[1] != self.action_dim or len(s) != len(a):
            raise ValueError(f"expected state (N, {self.state_dim}) and action "
                             f"(N, {self.action_dim}), got {s.shape} and {a.shape}")
        x = (np.hstack([s, a]) - self.in_norm.mean) / self.in_norm.std
        xt = torch.as_tensor(x, dtype=torch.float32).expand(self.cfg.members, -1, -1)
        with torch.no_grad():
            out = self.net(xt).numpy().astype(float)
        return s[None] + out * self.out_norm.std + self.out_norm.mean

    def predict(self, state: np.ndarray, action: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Return (mean next state (N, ds), disagreement (N,))."""
        m = self.members(state, action)
        return m.mean(axis=0), self._disagreement(m)

    def _disagreement(self, members: np.ndarray) -> np.ndarray:
        # Std across members in units of the data's own change per step, max over dimensions:
        # dimensionless, so positions and velocities weigh alike.
        return (members.std(axis=0) / self.out_norm.std).max(axis=1)

    def disagreement(self, state: np.ndarray, action: np.ndarray) -> np.ndarray:
        """Return the ensemble disagreement (N,), dimensionless."""
        return self._disagreement(self.members(state, action))

    def outside_data(self, state: np.ndarray, action: np.ndarray) -> np.ndarray:
        """Return True where the disagreement says the state is outside the training data."""
        return self.disagreement(state, action) > self.ood_threshold

    def step(self, state: np.ndarray, action: np.ndarray) -> np.ndarray:
        """Return the mean next state of one state (ds,)."""
        return self.predict(np.atleast_2d(state), np.atleast_2d(action))[0][0]

    # -- persistence --------------------------------------------------------------------------

    def save(self, path: str | Path) -> Path:
        """Write the model (weights, normalization, config) to one file."""
        buf = io.BytesIO()
        cfg = asdict(self.cfg)
        cfg["hidden"] = list(self.cfg.hidden)
        torch.save({
            "format": FORMAT,
            "config": json.dumps(cfg),
            "dims": [self.state_dim, self.action_dim],
            "state_dict": self.net.state_dict(),
            "norm": [self.in_norm.mean, self.in_norm.std, self.out_norm.mean, self.out_norm.std],
            "ood_threshold": self.ood_threshold,
        }, buf)
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(buf.getvalue())
        return p

    @classmethod
    def load(cls, path: str | Path) -> EnsembleWorldModel:
        """Read a model written by save(); ValueError for another format."""
        blob = torch.load(io.BytesIO(Path(path).read_bytes()), weights_only=False)
        if not isinstance(blob, dict) or blob.get("format") != FORMAT:
            raise ValueError(f"{path}: not a {FORMAT} file")
        cfg_d = json.loads(blob["config"])
        cfg_d["hidden"] = tuple(cfg_d["hidden"])
        model = cls(*blob["dims"], WorldModelConfig(**cfg_d))
        model.net.load_state_dict(blob["state_dict"])
        im, istd, om, ostd = blob["norm"]
        model.in_norm, model.out_norm = _Norm(im, istd), _Norm(om, ostd)
        model.ood_threshold = float(blob["ood_threshold"])
        return model


# --------------------------------------------------------------------------------------------
# Transitions from bags


def transitions_from_arrays(t_state_s: np.ndarray, state: np.ndarray, t_action_s: np.ndarray,
                            action: np.ndarray, period_s: float) -> Transitions:
    """Resample a state stream and a command stream on a control grid; pair them.

    At each grid time t the state is the latest sample at or before t, the action the latest
    command at or before t, the next state the latest sample at or before t + period.
    """
    ts = np.asarray(t_state_s, dtype=float)
    ta = np.asarray(t_action_s, dtype=float)
    if ts.size < 3 or ta.size < 1:
        raise ValueError(f"need >= 3 states and >= 1 action, got {ts.size} and {ta.size}")
    if period_s <= 0:
        raise ValueError(f"period_s must be > 0, got {period_s}")
    grid = np.arange(max(ts[0], ta[0]), ts[-1] - period_s, period_s)
    if grid.size == 0:
        raise ValueError("the streams do not overlap for one control period")
    i_s = np.searchsorted(ts, grid, side="right") - 1
    i_n = np.searchsorted(ts, grid + period_s, side="right") - 1
    i_a = np.searchsorted(ta, grid, side="right") - 1
    ok = (i_s >= 0) & (i_a >= 0) & (i_n > i_s)
    return Transitions(state[i_s[ok]], action[i_a[ok]], state[i_n[ok]])


def transitions_from_bag(bag_path: str | Path, joint_names: list[str], period_s: float
                         ) -> Transitions:
    """Build (q, qd), position command, next (q, qd) transitions from one bag.

    Both streams use the recorder's receive time, so they share one clock.
    """
    from sim2real_ros.sysid.bags import read_joint_states, read_position_commands

    js = read_joint_states(bag_path, joint_names)
    if js.velocity is None:
        raise ValueError(f"{bag_path}: joint_states carry no velocity; the world model needs it")
    cmd = read_position_commands(bag_path, len(joint_names))
    state = np.hstack([js.position, js.velocity])
    return transitions_from_arrays(js.recv_t_s, state, cmd.t_s, cmd.values, period_s)


# --------------------------------------------------------------------------------------------
# Consistency check


class Policy(Protocol):
    """Anything that maps a state (observation) to an action; `reset()` is optional."""

    def __call__(self, state: np.ndarray) -> np.ndarray: ...


# A simulator rollout: (start, policy, horizon) -> (states (H+1, ds), actions (H, da)). The
# simulator owns its state, so it reports the start state it actually realized.
SimRollout = Callable[[np.ndarray, Policy, int], tuple[np.ndarray, np.ndarray]]


def _reset(policy: Policy) -> None:
    reset = getattr(policy, "reset", None)
    if callable(reset):
        reset()


def model_rollout(model: EnsembleWorldModel, policy: Policy, start: np.ndarray, horizon: int
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Roll the policy out in the world model: states (H+1, ds), disagreement (H,)."""
    _reset(policy)
    states = [np.asarray(start, dtype=float)]
    dis = []
    for _ in range(horizon):
        a = np.asarray(policy(states[-1]), dtype=float)
        mean, d = model.predict(states[-1][None], a[None])
        states.append(mean[0])
        dis.append(float(d[0]))
    return np.vstack(states), np.asarray(dis)


def step_rollout(step: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> SimRollout:
    """Make a SimRollout from a pure step function next = step(state, action)."""

    def run(start: np.ndarray, policy: Policy, horizon: int) -> tuple[np.ndarray, np.ndarray]:
        _reset(policy)
        s = [np.asarray(start, dtype=float)]
        a = []
        for _ in range(horizon):
            a.append(np.asarray(policy(s[-1]), dtype=float))
            s.append(np.asarray(step(s[-1], a[-1]), dtype=float))
        return np.vstack(s), np.vstack(a)

    return run


@dataclass
class FlaggedState:
    """A visited simulator state where the check failed, and why."""

    start: int
    step: int
    state: list[float]
    reasons: list[str]
    divergence: float
    one_step_error: float
    disagreement: float


@dataclass
class ConsistencyReport:
    """Simulator vs world model along the policy's rollouts from the same starts."""

    divergence: np.ndarray  # (S, H+1) max |sim - model| over the compared dims, rollout vs rollout
    one_step_error: np.ndarray  # (S, H) max |model(s_t, a_t) - sim s_{t+1}| over compared dims
    disagreement: np.ndarray  # (S, H) ensemble disagreement at the simulator's states
    threshold: float
    ood_threshold: float
    flagged: list[FlaggedState] = field(default_factory=list)

    @property
    def n_states(self) -> int:
        """Visited (state, action) pairs checked."""
        return int(self.one_step_error.size)

    def flagged_fraction(self) -> float:
        """Fraction of visited states flagged for any reason."""
        return len(self.flagged) / max(self.n_states, 1)

    def summary(self, source: str) -> WorldModelSummary:
        """Return the evidence the checklist's dynamics row reads."""
        return WorldModelSummary(
            n_states=self.n_states,
            flagged_fraction=self.flagged_fraction(),
            out_of_data_fraction=float(np.mean(self.disagreement > self.ood_threshold)),
            mean_divergence_rad=float(self.divergence.mean()),
            max_divergence_rad=float(self.divergence.max()),
            threshold_rad=self.threshold,
            source=source,
        )

    def to_dict(self, max_flagged: int = 50) -> dict[str, Any]:
        """Return a JSON-ready summary with the first flagged states."""
        return {
            "n_starts": int(self.divergence.shape[0]),
            "horizon": int(self.one_step_error.shape[1]),
            "threshold": self.threshold,
            "ood_threshold": self.ood_threshold,
            "flagged_fraction": self.flagged_fraction(),
            "mean_divergence": float(self.divergence.mean()),
            "final_divergence_per_start": self.divergence[:, -1].tolist(),
            "max_one_step_error": float(self.one_step_error.max()),
            "flagged": [asdict(f) for f in self.flagged[:max_flagged]],
        }


def consistency_check(
    sim: SimRollout,
    model: EnsembleWorldModel,
    policy: Policy | Sequence[Policy],
    starts: np.ndarray,
    horizon: int,
    threshold: float,
    compare_dims: Sequence[int] | None = None,
    one_step_threshold: float | None = None,
) -> ConsistencyReport:
    """Roll the policy out in the simulator and the world model from the same starts.

    A visited state is flagged when the rollouts have drifted apart by more than `threshold`
    there, when (if `one_step_threshold` is given) the world model's one-step prediction from
    the simulator's own state misses the simulator's next state by more than that (a local
    disagreement, not compounded: it points at the state where the dynamics differ), or when the
    ensemble says the state is outside its data. `compare_dims` picks the state dimensions
    compared (default: all; for an arm, the joint positions, so the unit is rad).
    `policy` is one callable for every start or one per start; `reset()` is called if present.
    """
    starts = np.atleast_2d(np.asarray(starts, dtype=float))
    policies = list(policy) if isinstance(policy, Sequence) else [policy] * len(starts)
    if len(policies) != len(starts):
        raise ValueError(f"{len(policies)} policies for {len(starts)} starts")
    dims = np.arange(model.state_dim) if compare_dims is None else np.asarray(compare_dims)
    div, one, dis = [], [], []
    flagged: list[FlaggedState] = []
    for i, (s0, pol) in enumerate(zip(starts, policies, strict=True)):
        sim_s, sim_a = sim(s0, pol, horizon)
        wm_s, _ = model_rollout(model, pol, sim_s[0], horizon)
        d = np.abs(sim_s[:, dims] - wm_s[:, dims]).max(axis=1)
        pred, dis_i = model.predict(sim_s[:-1], sim_a)
        e = np.abs(pred[:, dims] - sim_s[1:, dims]).max(axis=1)
        div.append(d)
        one.append(e)
        dis.append(dis_i)
        for t in range(horizon):
            reasons = []
            if d[t + 1] > threshold:
                reasons.append("rollouts diverged")
            if one_step_threshold is not None and e[t] > one_step_threshold:
                reasons.append("one-step disagreement")
            if dis_i[t] > model.ood_threshold:
                reasons.append("outside the world model's data")
            if reasons:
                flagged.append(FlaggedState(i, t, sim_s[t].tolist(), reasons, float(d[t + 1]),
                                            float(e[t]), float(dis_i[t])))
    return ConsistencyReport(np.vstack(div), np.vstack(one), np.vstack(dis), threshold,
                             model.ood_threshold, flagged)
