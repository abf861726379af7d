"""A policy on the proxy plant without ROS: the cell's timing and the safety projection, offline.

The transfer experiment evaluates on the proxy only through the ROS graph, in real time (about a
minute per 30 targets, and the numbers move with the host's load). This harness runs the same
closed loop in plant time, in seconds, so a change to the policy, its teacher or its interface
can be judged on the proxy's dynamics before a full run:

- the MuJoCo plant of `proxy.plant` with a unit (it reads the unit's hidden values: a
  development tool, never part of the experiment's protocol, which sees only topics);
- joint_states sampled at `obs_rate_hz` (the experiment's 125 Hz broadcasters);
- the policy at its control rate on the latest sample, its command reaching the drive's bus
  after a uniform `hop_s` (the policy node's tick phase and the filter's hop on the graph),
  in the order sent;
- optionally the safety filter's projection (`safety.projection.Projector` on the shipped
  envelope, one projection per command, as `safety/ticks.py` schedules it), with the projected
  command fed back to the runner as the executed one (the policy node does the same), after
  a uniform `feedback_hop_s` (default none: before the next step; on a loaded graph it can
  come after it, which is how the runner's adoption rule cascaded: policy/runner.py);
- scoring by `proxy.scoring.EpisodeScorer`, episodes chained as on the graph.

Measured in the same session (docs/proxy.md, "Offline proxy harness"): the randomized policy of
transfer run 5 reached 80 % here and 37-60 % on the graph, and the harness located the
causes the graph run hid (the filter's repeated and skipped samples; the learner tripping the
filter's tool-speed bound; the teacher hunting without a lead). No rclpy here.
"""

from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sim2real_ros.proxy.scoring import EpisodeResult, EpisodeScorer


@dataclass(frozen=True)
class OfflineTiming:
    """The cell's timing as the harness models it."""

    obs_rate_hz: float = 125.0  # joint_states rate
    hop_s: tuple[float, float] = (0.001, 0.011)  # command: policy output -> drive bus (uniform)
    # executed command: drive bus -> the runner (uniform); it may come after the next step
    feedback_hop_s: tuple[float, float] = (0.0, 0.0)
    seed: int = 0

    def check(self) -> None:
        """Raise ValueError naming the bad value."""
        if not 1.0 <= self.obs_rate_hz <= 10000.0:
            raise ValueError(f"obs_rate_hz {self.obs_rate_hz}: expected [1, 10000] Hz")
        for name in ("hop_s", "feedback_hop_s"):
            lo, hi = getattr(self, name)
            if not 0.0 <= lo <= hi <= 0.5:
                raise ValueError(f"{name} {getattr(self, name)}: expected 0 <= low <= high "
                                 "<= 0.5 s")


@dataclass
class OfflineCounters:
    """What the projection did over an offline evaluation."""

    commands: int = 0
    intervened: int = 0  # commands the projection changed
    onsets: int = 0  # interventions after an unchanged command (a new disturbance)
    events: Counter[str] = field(default_factory=Counter)  # by limit
    onset_limits: Counter[str] = field(default_factory=Counter)
    adopted: int = 0  # runner steps that continued from the executed command

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        return {"commands": self.commands, "intervened": self.intervened,
                "onsets": self.onsets, "events": dict(self.events),
                "onset_limits": dict(self.onset_limits), "adopted": self.adopted}


def classify(result: EpisodeResult, tolerance_m: float) -> str:
    """'success', 'near' (came within the tolerance but never rested there) or 'far'."""
    if result.success:
        return "success"
    return "near" if result.min_distance_m < tolerance_m else "far"


def evaluate_on_plant(
    runner: Any, targets: np.ndarray, plant: Any, timing: OfflineTiming | None = None,
    envelope_path: str | Path | None = None, feed_executed: bool = True,
) -> tuple[list[EpisodeResult], OfflineCounters]:
    """Run `runner` (a `policy.runner.PolicyRunner` or one with its step/executed API) on the
    plant through the targets, chained; return the episode results and the projection's
    counters. `envelope_path`: project every command into that envelope (None: no filter).
    The plant is reset to the task's home pose first.
    """
    timing = timing or OfflineTiming()
    timing.check()
    task, arm = runner.task, runner.arm
    rng = np.random.default_rng(timing.seed)
    projector = None
    if envelope_path is not None:
        from sim2real_ros.safety.envelope import load_envelope
        from sim2real_ros.safety.projection import Projector

        projector = Projector(load_envelope(envelope_path, arm), arm, task.dt_s)
    counters = OfflineCounters()
    last = plant.reset(np.array(task.home_rad))
    scorer = EpisodeScorer(arm, task)
    dt, obs_dt = task.dt_s, 1.0 / timing.obs_rate_hz
    t, next_obs = 0.0, 0.0
    pending: list[tuple[float, int, np.ndarray]] = []  # (arrival at the bus, order, command)
    feedback: list[tuple[float, int, np.ndarray]] = []  # (arrival at the runner, order, cmd)
    order = 0
    last_arrival = -np.inf
    prev_intervened = False
    results: list[EpisodeResult] = []
    adopted0 = int(getattr(runner, "adopted", 0))
    for k, target in enumerate(np.asarray(targets, dtype=float)):
        scorer.start(k, t, target)
        while not scorer.timed_out(t) and not scorer.done:
            while feed_executed and feedback and feedback[0][0] <= t + 1e-12:
                runner.executed(heapq.heappop(feedback)[2])
            step = runner.step(last.q, last.qd, target)
            # One publisher's messages keep their order on the graph (reliable DDS).
            last_arrival = max(last_arrival, t + float(rng.uniform(*timing.hop_s)))
            heapq.heappush(pending, (last_arrival, order,
                                     np.asarray(step.joint_target_rad, dtype=float)))
            order += 1
            t_end = t + dt
            while True:
                nxt = min([next_obs] + [p[0] for p in pending[:1]])
                if nxt > t_end:
                    break
                plant.advance_to(nxt)
                if pending and pending[0][0] <= nxt + 1e-12:
                    _, _, cmd = heapq.heappop(pending)
                    if projector is not None:
                        res = projector.project_position(None, cmd.tolist(), dt, last.q.tolist())
                        counters.events.update(e.limit for e in res.events)
                        if res.intervened:
                            counters.intervened += 1
                            if not prev_intervened:
                                counters.onsets += 1
                                counters.onset_limits.update({e.limit for e in res.events})
                        prev_intervened = res.intervened
                        cmd = np.asarray(res.command, dtype=float)
                    counters.commands += 1
                    plant.command_position(cmd)
                    scorer.add_command(cmd)
                    if feed_executed:
                        lo, hi = timing.feedback_hop_s
                        back = float(rng.uniform(lo, hi)) if hi > 0.0 else 0.0
                        heapq.heappush(feedback, (nxt + back, order, cmd))
                        order += 1
                if next_obs <= nxt + 1e-12:
                    last = plant.measure()
                    next_obs += obs_dt
                    scorer.add_state(nxt, last.q, last.qd)
            plant.advance_to(t_end)
            t = t_end
        results.append(scorer.finish())
    counters.adopted = int(getattr(runner, "adopted", 0)) - adopted0
    return results, counters


def teacher_runner(task: dict[str, Any] | None = None, gains: Any = None,
                   arm: Any = None) -> Any:
    """A `PolicyRunner` whose actions come from the IK teacher (`policy.expert.IKExpert`)
    through the same action interface, adoption rule and command history as a policy's."""
    from types import SimpleNamespace

    from sim2real_ros.policy.expert import IKExpert
    from sim2real_ros.policy.runner import PolicyRunner, PolicyStep
    from sim2real_ros.policy.task import TaskConfig, advance_command
    from sim2real_ros.robot.model import load_arm

    if arm is None:
        from sim2real_ros.paths import default_urdf

        arm = load_arm(default_urdf())
    cfg = TaskConfig.from_dict(task or {})

    class TeacherRunner(PolicyRunner):
        def __init__(self) -> None:
            super().__init__(SimpleNamespace(task=cfg.to_dict(), joint_names=arm.joint_names),
                             arm)
            self.teacher = IKExpert(self.arm, self.task, gains)

        def step(self, q: np.ndarray, qd: np.ndarray, target_m: np.ndarray,
                 wrench: np.ndarray | None = None) -> Any:
            q = np.asarray(q, dtype=float)
            self.history = self._base(q)
            action = self.teacher.act(q[None], np.asarray(target_m, dtype=float)[None],
                                      np.asarray(qd, dtype=float)[None])[0]
            self.history = advance_command(self.task, self.arm, self.history, q, action)
            self.cmd = self.history[0].copy()
            self._own.append(self.cmd.copy())
            return PolicyStep(self.cmd.copy(), action, 0.0, 0.0, np.zeros(0))

    return TeacherRunner()


def record_excitation(plant: Any, exc: Any, obs_rate_hz: float = 125.0, settle_s: float = 2.0,
                      command_rate_hz: float = 100.0, name: str = "run") -> Any:
    """Run one excitation on the proxy plant as the sysid recorder does; return its recording.

    Hold `exc`'s first pose for `settle_s`, play the excitation at `command_rate_hz` (each
    command goes through the unit's bus latency and jitter), hold its last pose for `settle_s`;
    joint states (the unit's encoder errors included) at `obs_rate_hz`. Returns a
    `sysid.runs.RunData`, the form `sim2real sysid fit` reads from a bag. For identification
    studies offline (bench/study_excitation_recovery.py); the experiment records on the graph.
    """
    from sim2real_ros.sysid.runs import RunData

    if not (obs_rate_hz > 0 and command_rate_hz > 0 and settle_s >= 0):
        raise ValueError(f"obs_rate_hz = {obs_rate_hz}, command_rate_hz = {command_rate_hz} "
                         f"(expected > 0), settle_s = {settle_s} (expected >= 0)")
    plant.reset(exc.q[0])
    total = settle_s + exc.duration_s + settle_s
    cmd_t = np.arange(0.0, total, 1.0 / command_rate_hz)
    cmds = np.array([exc.at(t - settle_s) for t in cmd_t])
    obs_t = np.arange(0.0, total, 1.0 / obs_rate_hz)
    # Commands before samples at the same instant, as the recorder's tick precedes the read.
    events = sorted([(t, 0, i) for i, t in enumerate(cmd_t)]
                    + [(t, 1, i) for i, t in enumerate(obs_t)])
    q, qd, tau = [], [], []
    for t, kind, i in events:
        plant.advance_to(t)
        if kind == 0:
            plant.command_position(cmds[i], issued_at_s=t)
        else:
            m = plant.measure()
            q.append(m.q)
            qd.append(m.qd)
            tau.append(m.tau_nm)
    return RunData(name=name, joint_names=list(plant.joint_names), t_s=obs_t, q=np.array(q),
                   qd=np.array(qd), tau=np.array(tau), cmd_t_s=cmd_t, cmd=cmds)
