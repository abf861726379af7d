"""The training configuration, importable without torch (the CLI builds its parser from it)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from sim2real_ros.config import ConfigError

ALGOS = ("dagger", "ppo", "dagger+ppo")


@dataclass
class TrainConfig:
    """Everything that determines a training run (recorded with the policy)."""

    algo: str = "dagger"
    seed: int = 0
    n_envs: int = 16
    # 'default' = config/randomization.yaml, 'none', a spec file, or a calibration file (then
    # the calibrated simulator: its nominal plant values and its ranges)
    randomization: str = "default"
    hidden: tuple[int, ...] = (128, 128)
    members: int = 5
    # imitation
    dagger_iterations: int = 12
    steps_per_iteration: int = 150  # control steps per environment per iteration
    beta0: float = 1.0
    beta_decay: float = 0.5
    grad_steps_per_iteration: int = 400
    batch_size: int = 256
    lr: float = 1e-3
    max_dataset: int = 300_000
    # ppo
    ppo_iterations: int = 0
    ppo_steps: int = 128
    ppo_epochs: int = 4
    ppo_minibatch: int = 512
    ppo_lr: float = 1e-4
    ppo_clip: float = 0.2
    gamma: float = 0.99
    gae_lambda: float = 0.95
    init_log_std: float = -2.5
    # evaluation
    eval_episodes: int = 100  # final evaluation (the recorded sim success)
    iteration_eval_episodes: int = 16  # learner-only evaluation after every iteration (0 = off)
    time_budget_s: float = 0.0  # 0 = no budget; otherwise stop iterating after this long
    task: dict[str, Any] = field(default_factory=dict)  # TaskConfig overrides

    def validate(self, source: str = "<train config>") -> None:
        """Raise ConfigError for the first bad value."""
        if self.algo not in ALGOS:
            raise ConfigError(source, "algo", self.algo, f"one of {list(ALGOS)}")
        ints = {
            "n_envs": (1, 1024), "members": (1, 64), "dagger_iterations": (0, 10_000),
            "steps_per_iteration": (1, 100_000), "grad_steps_per_iteration": (0, 1_000_000),
            "batch_size": (1, 1_000_000), "ppo_iterations": (0, 100_000),
            "ppo_steps": (1, 100_000), "ppo_epochs": (1, 1000), "ppo_minibatch": (1, 10**7),
            "eval_episodes": (0, 100_000), "max_dataset": (1, 10**8),
            "iteration_eval_episodes": (0, 100_000),
        }
        for k, (lo, hi) in ints.items():
            v = getattr(self, k)
            if not isinstance(v, int) or not lo <= v <= hi:
                raise ConfigError(source, k, v, f"an integer in [{lo}, {hi}]")
        if "dagger" in self.algo and self.dagger_iterations < 1:
            raise ConfigError(source, "dagger_iterations", self.dagger_iterations,
                              f">= 1 for algo {self.algo}")
        if "ppo" in self.algo and self.ppo_iterations < 1:
            raise ConfigError(source, "ppo_iterations", self.ppo_iterations,
                              f">= 1 for algo {self.algo}")
        for k in ("lr", "ppo_lr"):
            v = getattr(self, k)
            if not 0 < v < 1:
                raise ConfigError(source, k, v, "a learning rate in (0, 1)")
        if not 0 <= self.beta0 <= 1 or not 0 <= self.beta_decay <= 1:
            raise ConfigError(source, "beta0/beta_decay", (self.beta0, self.beta_decay),
                              "values in [0, 1]")

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable dict."""
        d = asdict(self)
        d["hidden"] = list(self.hidden)
        return d
