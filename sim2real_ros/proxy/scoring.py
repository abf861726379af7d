"""Score reaching episodes from what a cell measures: joint states, FK, and the arm commands.

One protocol for the simulator and the proxy: a seeded sequence of reachable tool targets, each
an episode of at most `episode_s`; an episode succeeds when the tool (FK of the measured joint
positions) is within `tolerance_m` of the target with every joint slower than
`rest_speed_rad_s` (the task's own success rule); the next episode starts from wherever the
arm is. No rclpy here.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from sim2real_ros.policy.task import TaskConfig, is_success, sample_episode
from sim2real_ros.robot.model import ArmModel


@dataclass
class EpisodeResult:
    """One scored episode."""

    index: int
    target_m: list[float]
    success: bool
    time_to_success_s: float  # nan when it did not succeed
    final_distance_m: float
    min_distance_m: float
    tracking_rms_rad: float  # RMS of (last arm command - measured position), nan if no command
    n_states: int
    n_commands: int

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        return asdict(self)


@dataclass
class EpisodeScorer:
    """Accumulate one episode's samples and decide success with the task's rule."""

    arm: ArmModel
    task: TaskConfig
    index: int = 0
    _target: np.ndarray = field(default_factory=lambda: np.zeros(3))
    _t0: float = 0.0
    _done: bool = False
    _success_t: float = math.nan
    _last_distance: float = math.inf
    _min_distance: float = math.inf
    _last_cmd: np.ndarray | None = None
    _sq_err: float = 0.0
    _n_err: int = 0
    _n_states: int = 0
    _n_commands: int = 0

    def start(self, index: int, t_s: float, target_m: np.ndarray) -> None:
        """Begin an episode at time t_s towards a target (m, base frame)."""
        self.index = index
        self._target = np.asarray(target_m, dtype=float).copy()
        self._t0 = t_s
        self._done = False
        self._success_t = math.nan
        self._last_distance = math.inf
        self._min_distance = math.inf
        self._sq_err, self._n_err, self._n_states, self._n_commands = 0.0, 0, 0, 0

    def timed_out(self, t_s: float) -> bool:
        """Whether the episode's time is up."""
        return t_s - self._t0 >= self.task.episode_s

    @property
    def done(self) -> bool:
        """Whether the episode has ended in success."""
        return self._done

    def add_command(self, cmd_rad: np.ndarray) -> None:
        """Note the latest position command sent to the arm."""
        self._last_cmd = np.asarray(cmd_rad, dtype=float).copy()
        self._n_commands += 1

    def add_state(self, t_s: float, q: np.ndarray, qd: np.ndarray) -> bool:
        """Add one joint-state sample; return True when this sample completes the episode."""
        if self._done:
            return True
        q = np.asarray(q, dtype=float)
        d = float(np.linalg.norm(self.arm.tool_position(q) - self._target))
        self._last_distance = d
        self._min_distance = min(self._min_distance, d)
        self._n_states += 1
        if self._last_cmd is not None:
            self._sq_err += float(np.sum(np.square(self._last_cmd - q)))
            self._n_err += q.size
        if t_s - self._t0 <= self.task.episode_s and is_success(self.task, d, np.asarray(qd)):
            self._done = True
            self._success_t = t_s - self._t0
        return self._done

    def finish(self) -> EpisodeResult:
        """Return the episode's result."""
        return EpisodeResult(
            index=self.index,
            target_m=self._target.tolist(),
            success=self._done,
            time_to_success_s=self._success_t,
            final_distance_m=self._last_distance,
            min_distance_m=self._min_distance,
            tracking_rms_rad=math.sqrt(self._sq_err / self._n_err) if self._n_err else math.nan,
            n_states=self._n_states,
            n_commands=self._n_commands,
        )


def episode_targets(seed: int, count: int, task: TaskConfig, arm: ArmModel) -> np.ndarray:
    """Return a seeded sequence of reachable targets (count x 3, m), each one at least the task's
    minimum distance from the one before (so chained episodes are real moves)."""
    rng = np.random.default_rng(seed)
    out: list[np.ndarray] = []
    prev = arm.tool_position(np.array(task.home_rad))
    while len(out) < count:
        _, target = sample_episode(rng, task, arm)
        if np.linalg.norm(target - prev) >= task.min_distance_m:
            out.append(target)
            prev = target
    return np.array(out)


@dataclass
class EvaluationSummary:
    """Aggregate of one evaluation (one policy, one plant)."""

    n_episodes: int
    success_rate: float
    mean_time_to_success_s: float
    median_final_distance_m: float
    tracking_rms_rad: float

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        return asdict(self)


def summarize(results: list[EpisodeResult]) -> EvaluationSummary:
    """Aggregate episode results (success rate, times, distances, tracking)."""
    if not results:
        return EvaluationSummary(0, math.nan, math.nan, math.nan, math.nan)
    succ = [r for r in results if r.success]
    track = [r.tracking_rms_rad for r in results if not math.isnan(r.tracking_rms_rad)]
    return EvaluationSummary(
        n_episodes=len(results),
        success_rate=len(succ) / len(results),
        mean_time_to_success_s=float(np.mean([r.time_to_success_s for r in succ]))
        if succ else math.nan,
        median_final_distance_m=float(np.median([r.final_distance_m for r in results])),
        tracking_rms_rad=float(np.sqrt(np.mean(np.square(track)))) if track else math.nan,
    )
