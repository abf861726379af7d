"""Train a reaching policy in the randomized simulator: BC + DAgger from the IK expert, PPO.

- Imitation (`algo="dagger"`): iteration 0 rolls out the expert and fits the ensemble by
  behaviour cloning; every later iteration rolls out a per-step mixture (expert with
  probability beta = beta0 * beta_decay^i, else the ensemble mean), labels every visited
  observation with the expert's action, aggregates and refits (DAgger). Each member trains on
  its own random minibatches, which keeps the members different where data are thin.
- PPO (`algo="ppo"` from scratch or `"dagger+ppo"` as a fine-tune): Gaussian exploration
  around the ensemble mean, clipped surrogate, GAE, a separate value network. The ensemble mean
  is the acting policy, so every member gets the same output-space gradient and their spread
  (the disagreement signal) is preserved.
- Every iteration logs the mean return and success rate of the episodes that ended in it; the
  final policy is evaluated on fresh seeded episodes (the "sim success" in its metadata).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from sim2real_ros.config import ConfigError
from sim2real_ros.policy.env import ReachingVecEnv, load_simulator
from sim2real_ros.policy.model import EnsemblePolicy, ModelSpec, ObsStats
from sim2real_ros.policy.obs_floor import SensorTolerance, observation_std_floor
from sim2real_ros.policy.task import TaskConfig

from sim2real_ros.policy.train_config import ALGOS, TrainConfig  # noqa: F401 (re-exported)


@dataclass
class IterationLog:
    """One row of the learning curve."""

    iteration: int
    phase: str
    beta: float
    episodes: int
    success_rate: float
    mean_return: float
    env_steps: int
    wall_s: float
    loss: float
    eval_success: float = math.nan  # the learner alone on fixed fresh episodes
    eval_return: float = math.nan


@dataclass
class TrainResult:
    """What `train` returns."""

    policy: EnsemblePolicy
    history: list[IterationLog]
    sim_success: float
    eval_mean_steps: float
    wall_s: float
    env_steps: int
    spec_sha256: str


class _Episodes:
    """Collects finished-episode statistics within one iteration."""

    def __init__(self) -> None:
        self.returns: list[float] = []
        self.success: list[float] = []

    def add(self, ep_ret: np.ndarray, ep_succ: np.ndarray) -> None:
        m = ~np.isnan(ep_succ)
        self.returns += ep_ret[m].tolist()
        self.success += ep_succ[m].tolist()

    def summary(self) -> tuple[int, float, float]:
        if not self.success:
            return 0, float("nan"), float("nan")
        return len(self.success), float(np.mean(self.success)), float(np.mean(self.returns))


def _policy_action(policy: EnsemblePolicy, obs: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        m = policy.members_torch(torch.as_tensor(obs, dtype=torch.float32))
    return m.mean(dim=0).numpy().astype(float)


@dataclass
class EvalResult:
    """Performance of a policy on fresh seeded episodes."""

    success_rate: float
    mean_steps_to_success: float  # control steps, over successful episodes (nan if none)
    mean_return: float
    episodes: int


def evaluate_in_sim(
    policy: EnsemblePolicy | None,
    n_episodes: int,
    task: TaskConfig,
    spec: Any,
    seed: int,
    n_envs: int = 8,
    calibration: Any = None,
) -> EvalResult:
    """Run the ensemble-mean policy (or the expert if None) on n fresh seeded episodes.

    `calibration` (PlantParams) puts the simulator's plant at calibrated nominal values.
    """
    env = ReachingVecEnv(min(n_envs, max(1, n_episodes)), task, spec, seed=seed,
                         calibration=calibration)
    try:
        obs = env.reset()
        succ: list[float] = []
        rets: list[float] = []
        steps: list[int] = []
        # Only the first n_episodes that start are counted, so the sample is not biased
        # toward short (successful) episodes.
        started = env.n
        counted = np.ones(env.n, dtype=bool)
        while len(succ) < n_episodes:
            act = env.expert_actions() if policy is None else _policy_action(policy, obs)
            r = env.step(act)
            obs = r.obs
            for i in np.flatnonzero(~np.isnan(r.episode_success)):
                if counted[i] and len(succ) < n_episodes:
                    succ.append(float(r.episode_success[i]))
                    rets.append(float(r.episode_return[i]))
                    if r.episode_success[i] > 0:
                        steps.append(int(r.episode_steps[i]))
                counted[i] = started < n_episodes
                started += 1
        return EvalResult(float(np.mean(succ)), float(np.mean(steps)) if steps else math.nan,
                          float(np.mean(rets)), len(succ))
    finally:
        env.close()


class _Value(nn.Module):
    def __init__(self, obs_dim: int, hidden: tuple[int, ...]) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for a, b in zip((obs_dim, *hidden[:-1]), hidden, strict=True):
            layers += [nn.Linear(a, b), nn.Tanh()]
        layers.append(nn.Linear(hidden[-1], 1))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).squeeze(-1)


def train(
    cfg: TrainConfig,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
) -> TrainResult:
    """Run one seeded training; return the policy, its learning curve and its sim success."""
    cfg.validate()
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    task = TaskConfig.from_dict(cfg.task) if cfg.task else TaskConfig()
    # A calibration file trains in the calibrated simulator: its nominal plant and its ranges.
    spec, nominal = load_simulator(cfg.randomization)
    spec_sha = str(getattr(spec, "sha256", ""))
    env = ReachingVecEnv(cfg.n_envs, task, spec, seed=cfg.seed, calibration=nominal)
    task = env.task  # with the command limits resolved: the policy file stores them
    t_start = time.monotonic()
    history: list[IterationLog] = []
    say = log or (lambda s: None)
    n_iter = (cfg.dagger_iterations if "dagger" in cfg.algo else 0) + (
        cfg.ppo_iterations if "ppo" in cfg.algo else 0)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=n_iter, desc=f"train {cfg.algo}", unit="it", dynamic_ncols=True)

    def record(row: IterationLog, learner: EnsemblePolicy) -> None:
        if cfg.iteration_eval_episodes:
            # Same episodes every iteration (fixed seed), so the points are comparable.
            ev = evaluate_in_sim(learner, cfg.iteration_eval_episodes, task, spec,
                                 seed=cfg.seed + 7919, calibration=nominal)
            row.eval_success, row.eval_return = ev.success_rate, ev.mean_return
        history.append(row)
        line = (f"iter {row.iteration:3d} {row.phase:6s} beta={row.beta:.2f} "
                f"rollout: episodes={row.episodes:4d} success={row.success_rate:.3f} "
                f"return={row.mean_return:7.2f} | learner: success={row.eval_success:.3f} "
                f"return={row.eval_return:7.2f} | loss={row.loss:.4g} "
                f"steps={row.env_steps} wall={time.monotonic() - t_start:.1f}s")
        say(line)
        if bar is not None:
            bar.set_postfix(success=f"{row.eval_success:.2f}", ret=f"{row.eval_return:.1f}")
            bar.update(1)
            bar.write(line)

    mspec = ModelSpec(env.obs_dim, env.act_dim, tuple(cfg.hidden), cfg.members)
    policy: EnsemblePolicy | None = None
    obs = env.reset()
    try:
        if "dagger" in cfg.algo:
            policy, obs = _dagger(cfg, env, mspec, task, rng, obs, record, t_start)
        if "ppo" in cfg.algo:
            if policy is None:
                stats = _initial_stats(env, obs, cfg.steps_per_iteration,
                                       obs_floor_for(task, env.arm.n_joints))
                obs = env.reset()
                policy = EnsemblePolicy(mspec, stats, task.to_dict(), env.arm.joint_names,
                                        seed=cfg.seed)
            _ppo(cfg, env, policy, obs, record, t_start, len(history))
    finally:
        env.close()
        if bar is not None:
            bar.close()
    assert policy is not None
    if cfg.eval_episodes:
        final = evaluate_in_sim(policy, cfg.eval_episodes, task, spec, seed=cfg.seed + 1_000_003,
                                calibration=nominal)
        sim_success, mean_steps = final.success_rate, final.mean_steps_to_success
    else:
        sim_success, mean_steps = math.nan, math.nan
    wall = time.monotonic() - t_start
    say(f"evaluation: success {sim_success:.3f} over {cfg.eval_episodes} fresh episodes, "
        f"mean time to success {mean_steps * task.dt_s:.2f} s; wall {wall:.1f} s")
    policy.metadata = {
        "trainer": "sim2real_ros.policy.train",
        "train_config": cfg.to_dict(),
        "task": task.to_dict(),
        "seed": cfg.seed,
        "randomization": cfg.randomization,
        "randomization_sha256": spec_sha,
        "calibrated_nominal": nominal.to_dict() if nominal is not None else None,
        "sim_success": sim_success,
        "sim_eval_episodes": cfg.eval_episodes,
        "sim_mean_time_to_success_s": mean_steps * task.dt_s,
        "train_wall_s": wall,
        "env_steps": int(env.total_steps),
        "history": [asdict(h) for h in history],
        # Per-column std floor the statistics were built with (policy/obs_floor.py).
        "obs_std_floor": obs_floor_for(task, env.arm.n_joints).tolist(),
    }
    return TrainResult(policy, history, sim_success, mean_steps, wall, env.total_steps, spec_sha)


def obs_floor_for(task: TaskConfig, n_joints: int) -> np.ndarray:
    """The std floor of every observation column: the shipped real-unit sensor tolerances.

    The floor describes the robot the policy will meet, not the training run, so it comes from
    the shipped config/randomization.yaml whatever `randomization` the run trains with.
    """
    return observation_std_floor(task, n_joints, SensorTolerance.from_randomization())


def _initial_stats(
    env: ReachingVecEnv, obs: np.ndarray, steps: int, floor: np.ndarray
) -> ObsStats:
    """Observation statistics from expert rollouts (PPO from scratch needs a normalizer too)."""
    rows = [obs]
    for _ in range(steps):
        r = env.step(env.expert_actions())
        rows.append(r.obs)
    return ObsStats.from_data(np.concatenate(rows), floor=floor)


def _dagger(
    cfg: TrainConfig,
    env: ReachingVecEnv,
    mspec: ModelSpec,
    task: TaskConfig,
    rng: np.random.Generator,
    obs: np.ndarray,
    record: Callable[[IterationLog, EnsemblePolicy], None],
    t_start: float,
) -> tuple[EnsemblePolicy, np.ndarray]:
    data_obs: list[np.ndarray] = []
    data_act: list[np.ndarray] = []
    policy: EnsemblePolicy | None = None
    opt: torch.optim.Optimizer | None = None
    gen = torch.Generator().manual_seed(cfg.seed)
    for it in range(cfg.dagger_iterations):
        if cfg.time_budget_s and it > 0 and time.monotonic() - t_start > cfg.time_budget_s:
            break
        beta = 1.0 if policy is None else cfg.beta0 * cfg.beta_decay**it
        eps = _Episodes()
        for _ in range(cfg.steps_per_iteration):
            expert = env.expert_actions()
            data_obs.append(obs)
            data_act.append(expert)
            if policy is None:
                act = expert
            else:
                act = _policy_action(policy, obs)
                use_expert = rng.random(env.n) < beta
                act[use_expert] = expert[use_expert]
            r = env.step(act)
            eps.add(r.episode_return, r.episode_success)
            obs = r.obs
        x = np.concatenate(data_obs)[-cfg.max_dataset:]
        y = np.concatenate(data_act)[-cfg.max_dataset:]
        if policy is None:
            # Normalization statistics come from the expert's own state distribution.
            floor = obs_floor_for(task, env.arm.n_joints)
            policy = EnsemblePolicy(mspec, ObsStats.from_data(x, floor=floor), task.to_dict(),
                                    env.arm.joint_names, seed=cfg.seed)
            opt = torch.optim.Adam(policy.net.parameters(), lr=cfg.lr)
        assert opt is not None
        loss = _fit(policy, opt, x, y, cfg.grad_steps_per_iteration, cfg.batch_size, gen)
        n_ep, succ, ret = eps.summary()
        record(IterationLog(it, "dagger" if it else "bc", beta, n_ep, succ, ret,
                            env.total_steps, time.monotonic() - t_start, loss), policy)
    assert policy is not None
    return policy, obs


def _fit(
    policy: EnsemblePolicy,
    opt: torch.optim.Optimizer,
    x: np.ndarray,
    y: np.ndarray,
    steps: int,
    batch: int,
    gen: torch.Generator,
) -> float:
    """Regress every member on its own random minibatches; return the final mean loss."""
    xt = torch.as_tensor(x, dtype=torch.float32)
    # Labels at the bound are pulled slightly inside so tanh outputs can reach them.
    yt = torch.as_tensor(np.clip(y, -0.98, 0.98), dtype=torch.float32)
    n = xt.shape[0]
    members = policy.spec.members
    last = math.nan
    for _ in range(steps):
        idx = torch.randint(0, n, (members, min(batch, n)), generator=gen)
        pred = policy.members_torch(xt[idx])
        loss = torch.mean((pred - yt[idx]) ** 2)
        opt.zero_grad()
        loss.backward()
        opt.step()
        last = float(loss.detach())
    return last


def _ppo(
    cfg: TrainConfig,
    env: ReachingVecEnv,
    policy: EnsemblePolicy,
    obs: np.ndarray,
    record: Callable[[IterationLog, EnsemblePolicy], None],
    t_start: float,
    it0: int,
) -> None:
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    value = _Value(policy.spec.obs_dim, tuple(cfg.hidden))
    log_std = nn.Parameter(torch.full((policy.spec.act_dim,), cfg.init_log_std))
    opt = torch.optim.Adam(
        [*policy.net.parameters(), log_std, *value.parameters()], lr=cfg.ppo_lr
    )
    b, a_dim = env.n, policy.spec.act_dim
    for it in range(cfg.ppo_iterations):
        if cfg.time_budget_s and time.monotonic() - t_start > cfg.time_budget_s:
            break
        t_n = cfg.ppo_steps
        buf_obs = np.zeros((t_n, b, policy.spec.obs_dim), dtype=np.float32)
        buf_act = np.zeros((t_n, b, a_dim), dtype=np.float32)
        buf_logp = np.zeros((t_n, b), dtype=np.float32)
        buf_rew = np.zeros((t_n, b), dtype=np.float32)
        buf_val = np.zeros((t_n, b), dtype=np.float32)
        buf_next_val = np.zeros((t_n, b), dtype=np.float32)  # bootstrap at truncation
        buf_done = np.zeros((t_n, b), dtype=np.float32)
        eps = _Episodes()
        for t in range(t_n):
            with torch.no_grad():
                ot = torch.as_tensor(obs, dtype=torch.float32)
                mu = policy.members_torch(ot).mean(dim=0)
                std = log_std.exp()
                noise = torch.randn(mu.shape, generator=gen)
                a = mu + std * noise
                logp = torch.distributions.Normal(mu, std).log_prob(a).sum(-1)
                v = value(policy.normalize(ot))
            r = env.step(np.clip(a.numpy(), -1.0, 1.0))
            buf_obs[t], buf_act[t], buf_logp[t] = obs, a.numpy(), logp.numpy()
            buf_rew[t], buf_val[t] = r.reward, v.numpy()
            done = r.terminated | r.truncated
            buf_done[t] = done
            with torch.no_grad():
                fv = value(policy.normalize(torch.as_tensor(r.final_obs, dtype=torch.float32)))
            # Bootstrap through a time-limit cut, not through success (a true terminal).
            buf_next_val[t] = np.where(r.terminated, 0.0, fv.numpy())
            eps.add(r.episode_return, r.episode_success)
            obs = r.obs
        adv = np.zeros((t_n, b), dtype=np.float32)
        last = np.zeros(b, dtype=np.float32)
        for t in reversed(range(t_n)):
            nonterminal = 1.0 - buf_done[t]
            next_v = np.where(buf_done[t] > 0, buf_next_val[t],
                              buf_val[t + 1] if t + 1 < t_n else buf_next_val[t])
            delta = buf_rew[t] + cfg.gamma * next_v - buf_val[t]
            last = delta + cfg.gamma * cfg.gae_lambda * nonterminal * last
            adv[t] = last
        ret = adv + buf_val
        fo = torch.as_tensor(buf_obs.reshape(-1, policy.spec.obs_dim))
        fa = torch.as_tensor(buf_act.reshape(-1, a_dim))
        flp = torch.as_tensor(buf_logp.reshape(-1))
        fadv = torch.as_tensor(adv.reshape(-1))
        fadv = (fadv - fadv.mean()) / (fadv.std() + 1e-8)
        fret = torch.as_tensor(ret.reshape(-1))
        n = fo.shape[0]
        loss_v = math.nan
        for _ in range(cfg.ppo_epochs):
            perm = torch.randperm(n, generator=gen)
            for s in range(0, n, cfg.ppo_minibatch):
                idx = perm[s:s + cfg.ppo_minibatch]
                mu = policy.members_torch(fo[idx]).mean(dim=0)
                dist = torch.distributions.Normal(mu, log_std.exp())
                logp = dist.log_prob(fa[idx]).sum(-1)
                ratio = torch.exp(logp - flp[idx])
                s1 = ratio * fadv[idx]
                s2 = torch.clamp(ratio, 1 - cfg.ppo_clip, 1 + cfg.ppo_clip) * fadv[idx]
                v = value(policy.normalize(fo[idx]))
                loss = -torch.min(s1, s2).mean() + 0.5 * torch.mean((v - fret[idx]) ** 2)
                opt.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_([*policy.net.parameters(), *value.parameters()], 1.0)
                opt.step()
                loss_v = float(loss.detach())
        n_ep, succ, mret = eps.summary()
        record(IterationLog(it0 + it, "ppo", 0.0, n_ep, succ, mret, env.total_steps,
                            time.monotonic() - t_start, loss_v), policy)


def plot_learning_curve(history: list[IterationLog], path: str | Path, title: str = "") -> Path:
    """Write success rate and mean return per iteration as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    steps = [h.env_steps for h in history]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(6.4, 5.2), sharex=True)
    ax1.plot(steps, [h.success_rate for h in history], ".--", color="tab:grey",
             label="rollout (expert mixture / exploration)")
    if any(math.isfinite(h.eval_success) for h in history):
        ax1.plot(steps, [h.eval_success for h in history], "o-", color="tab:green",
                 label="learner alone, fixed fresh episodes")
    ax1.set_ylabel("success rate")
    ax1.set_ylim(-0.02, 1.02)
    ax1.axhline(0.9, color="grey", ls=":", lw=0.8)
    ax1.legend(loc="lower right", fontsize=8)
    ax2.plot(steps, [h.mean_return for h in history], ".--", color="tab:grey", label="rollout")
    if any(math.isfinite(h.eval_return) for h in history):
        ax2.plot(steps, [h.eval_return for h in history], "o-", color="tab:blue",
                 label="learner alone")
    ax2.set_ylabel("mean episode return")
    ax2.set_xlabel("environment steps (training rollouts)")
    ax2.legend(loc="lower right", fontsize=8)
    for h in history:
        if h.phase == "ppo":
            ax1.axvline(h.env_steps, color="tab:orange", alpha=0.3)
    ax1.set_title(title or "training")
    fig.tight_layout()
    fig.savefig(p, dpi=90)
    plt.close(fig)
    return p


def write_run(result: TrainResult, out_dir: str | Path) -> dict[str, Path]:
    """Write policy.pt, metadata.json, history.json and learning_curve.png into out_dir."""
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    paths = {
        "policy": result.policy.save(d / "policy.pt"),
        "metadata": d / "metadata.json",
        "history": d / "history.json",
        "curve": d / "learning_curve.png",
    }
    meta = {k: v for k, v in result.policy.metadata.items() if k != "history"}
    paths["metadata"].write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    paths["history"].write_text(
        json.dumps([asdict(h) for h in result.history], indent=1) + "\n")
    cfg = result.policy.metadata.get("train_config", {})
    plot_learning_curve(
        result.history, paths["curve"],
        f"{cfg.get('algo', '')} seed {cfg.get('seed', '')}: eval success "
        f"{result.sim_success:.2f}, {result.wall_s:.0f} s",
    )
    return paths
