"""Fine-tune only the last layer of a policy on real trajectories recorded as rosbag2 (MCAP).

What is learned (`labels`):

- `teacher` (the default for the jerk-limited interface): the IK teacher's action at every
  recorded state, the policy's own training label, now on the states the real arm visited
  (DAgger's relabelling on real data: the last layer corrects the policy where the real arm
  took it away from the simulator's state distribution). The teacher needs only q, q̇ and the
  target, all in the bag.
- `commands` (the default for the `step` interface): to reproduce the joint commands that drove
  the real arm (default topic `forward_position_controller/commands`: whatever reached the arm,
  for instance the baseline controller acting while the policy ran in shadow mode), as the
  step from the previous command. For the jerk-limited interface that label is wrong: its
  action requests a command *velocity* the command then approaches under the jerk limit, so
  fitting the request to the step taken makes the policy request what it already does (the
  transfer experiment's run 6 child: 0 % in sim and on the proxy). It is refused there.

The observations are those the policy would have seen. Each command is paired with the latest
`joint_states` received before it was sent (or, for a stamped JointState command topic such as
`baseline/joint_command`, the joint state whose stamp it carries) and with the latest
`task/target`; the observation carries the previous command.

What the loss compares (`fit_space`):

- `action`: the normalized action, `tanh(head)` against `step_to_action(label)`
  clipped to ±0.98 — the space the policy was trained in (`policy.train._fit`). The signed
  square `a|a|` of `action_to_step` exists to resolve small moves near the target; regressing in
  that space keeps the resolution the policy came to rest with.
- `step` (the default): the normalized step `a|a|` against `label / scale`. A move of 1 % of the scale is an
  action of 0.1, but contributes 1e-4 to a step-space loss: the near-target moves, the ones that
  decide whether a reach ends inside the tolerance, are almost unconstrained, and the transfer
  experiment's step-4 children were suspected of regressing that way (docs/proxy.md, run 11).
  Measured on the proxy it was not the cause: the action-space fit did worse (run 12: 27 %
  against run 10's 73 % in step space; offline on run 12's bag, 0.63 against 0.78 in the
  parent's simulator), so the step space stays the default and `action` is an option.

Rehearsal (`anchor`): the recorded states are those the real arm visited under whatever drove
it; in shadow mode that is the baseline, whose command history the policy never produces
itself. A last layer fitted only there can change what the policy does on its own states (the
transfer experiment's seed-1 children: 93 → 20 % in their parent's simulator). `sim_anchor`
rolls the parent out in its own simulator and labels every state with the teacher; those
samples enter the loss with weight `anchor_weight`, so the update must keep the policy's own
behaviour while it corrects the real-arm states (rehearsal against forgetting, as in
continual learning). The report gives the action error on the anchor before and after.
Measured on the transfer experiment's run 12 (seed 1) bag, children in their parent's
calibrated simulator: a refit on the parent's own sim states alone is harmless (0.93 against
the parent's 0.90), a refit on the proxy states alone breaks it (0.15, action space), and the
proxy states plus 16 000 rehearsal samples at weight 3 keep it (0.90) while the proxy-state
error still falls from 0.161 to 0.100 (docs/proxy.md).

A trajectory is a run of commands under one target. Trajectories, not samples, are split into
training and held-out sets (seeded), so the reported before/after error is on motions the
fine-tune never saw. Only the members' output layers change: the hidden features stay as the
simulator trained them, the observation statistics (and so the OOD score) stay those of
simulation, and an L2 pull toward the original output weights keeps the update small.
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sim2real_ros.policy.expert import ExpertGains, IKExpert
from sim2real_ros.policy.model import EnsemblePolicy
from sim2real_ros.policy.task import (
    TaskConfig,
    action_to_step,
    advance_command,
    build_observation,
    initial_history,
    resolve_rate_limits,
    sample_episode,
    step_scale_rad,
    step_to_action,
)
from sim2real_ros.robot.model import ArmModel

TARGET_TOPIC = "task/target"
JOINT_STATES = "joint_states"
COMMAND_TOPIC = "forward_position_controller/commands"


class FinetuneError(ValueError):
    """The bags cannot be turned into training data; the message says which and why."""


@dataclass
class Trajectory:
    """Aligned samples of one target segment."""

    bag: str
    target_m: np.ndarray  # (3,)
    obs: np.ndarray  # (T, D) raw observations
    step_rad: np.ndarray  # (T, n) recorded joint-command steps
    q: np.ndarray | None = None  # (T, n) measured joint positions the policy saw, rad
    qd: np.ndarray | None = None  # (T, n) measured joint velocities, rad/s


@dataclass
class FinetuneReport:
    """Errors are RMS joint-command step errors on held-out trajectories, rad: against the
    recorded step (`commands`) or the teacher's requested step (`teacher`)."""

    n_trajectories: int
    n_train: int
    n_heldout: int
    n_train_samples: int
    n_heldout_samples: int
    before_rms_rad: float
    after_rms_rad: float
    before_per_joint_rad: list[float]
    after_per_joint_rad: list[float]
    train_before_rms_rad: float
    train_after_rms_rad: float
    bags: list[str] = field(default_factory=list)
    bag_sha256: str = ""
    labels: str = "commands"
    fit_space: str = "step"
    # RMS normalized-action error on the held-out trajectories (the action-space loss).
    before_action_rms: float = float("nan")
    after_action_rms: float = float("nan")
    # Rehearsal: samples from the parent's own simulator, and the action error there.
    n_anchor_samples: int = 0
    anchor_weight: float = 0.0
    anchor_before_action_rms: float = float("nan")
    anchor_after_action_rms: float = float("nan")

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable dict."""
        return dict(self.__dict__)


def _bags_sha256(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for p in sorted(paths):
        files = sorted(p.glob("*.mcap")) if p.is_dir() else [p]
        for f in files:
            h.update(f.read_bytes())
    return h.hexdigest()


def _latest_before(times: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Index of the last element of sorted `times` <= each t (-1 if none)."""
    return np.searchsorted(times, t, side="right") - 1


def load_trajectories(
    bag_paths: list[str | Path],
    task: TaskConfig,
    arm: ArmModel,
    command_topic: str = COMMAND_TOPIC,
    target_topic: str = TARGET_TOPIC,
    joint_topic: str = JOINT_STATES,
    max_gap_periods: float = 5.0,
) -> list[Trajectory]:
    """Read bags into aligned trajectories (observation, recorded step) per target."""
    from sim2real_ros.sysid import bags as bagio

    out: list[Trajectory] = []
    names = list(arm.joint_names)
    for bp in bag_paths:
        p = Path(bp)
        js = bagio.read_joint_states(p, names, joint_topic)
        if js.velocity is None:
            raise FinetuneError(f"{p}: {joint_topic} has no velocities; the policy observes them")
        info = bagio.bag_info(p)
        ctopic = bagio.resolve_topic(p, info.topics, command_topic)
        ctype = info.topics[ctopic].msgtype
        if ctype == "std_msgs/msg/Float64MultiArray":
            cmds = bagio.read_position_commands(p, len(names), ctopic)
            # The command answered the latest state the controller had received.
            js_idx = _latest_before(js.recv_t_s, cmds.t_s)
        elif ctype == "sensor_msgs/msg/JointState":
            cmds = bagio.read_joint_commands(p, names, ctopic)
            assert cmds.stamp_s is not None
            # Stamped commands name the observation they answer.
            order = np.argsort(js.t_s)
            pos = np.clip(np.searchsorted(js.t_s[order], cmds.stamp_s), 0, len(order) - 1)
            js_idx = order[pos]
        else:
            raise FinetuneError(f"{p}: {ctopic} has type {ctype}; expected "
                                "std_msgs/msg/Float64MultiArray or sensor_msgs/msg/JointState")
        tgt_t: list[float] = []
        tgt_v: list[np.ndarray] = []
        for _, t_ns, msg in bagio.read_messages(p, [target_topic]):
            tgt_t.append(t_ns * 1e-9)
            tgt_v.append(np.array([msg.point.x, msg.point.y, msg.point.z]))
        if not tgt_t:
            raise FinetuneError(f"{p}: no messages on {target_topic}")
        tgt_times = np.asarray(tgt_t)
        tgt_vals = np.vstack(tgt_v)
        tgt_idx = _latest_before(tgt_times, cmds.t_s)
        dt = task.dt_s
        period = np.median(np.diff(cmds.t_s)) if len(cmds.t_s) > 2 else dt
        if not 0.8 * dt <= period <= 1.25 * dt:
            raise FinetuneError(
                f"{p}: {ctopic} runs every {period * 1e3:.1f} ms; the policy steps every "
                f"{dt * 1e3:.1f} ms ({task.control_rate_hz:g} Hz), so its steps are not comparable"
            )
        segments: list[list[int]] = []
        for k in range(1, len(cmds.t_s)):
            if js_idx[k] < 0 or tgt_idx[k] < 0:
                continue
            new_seg = (
                not segments
                or segments[-1][-1] != k - 1
                or cmds.t_s[k] - cmds.t_s[k - 1] > max_gap_periods * dt
                or np.any(np.abs(tgt_vals[tgt_idx[k]] - tgt_vals[tgt_idx[k - 1]]) > 1e-9)
            )
            if new_seg:
                segments.append([k])
            else:
                segments[-1].append(k)
        for seg in segments:
            if len(seg) < 3:
                continue
            k = np.asarray(seg)
            q = js.position[js_idx[k]]
            qd = js.velocity[js_idx[k]]
            target = tgt_vals[tgt_idx[k[0]]]
            prev = cmds.values[k - 1]
            # The command history the policy would have continued from (newest first).
            hist = np.stack([cmds.values[np.maximum(k - j, 0)] for j in (1, 2, 3)], axis=1)
            tool = np.array([arm.tool_position(qq) for qq in q])
            obs = build_observation(task, q, qd, np.broadcast_to(target, (len(k), 3)), tool,
                                    prev, None, hist)
            out.append(Trajectory(str(p), target.copy(), obs, cmds.values[k] - prev,
                                  q=q.copy(), qd=qd.copy()))
    if not out:
        raise FinetuneError(f"no trajectories found in {[str(b) for b in bag_paths]}")
    return out


def _step_error(policy: EnsemblePolicy, obs: np.ndarray, step: np.ndarray) -> np.ndarray:
    """Per-sample, per-joint error of the policy's step vs the label step, rad."""
    task = TaskConfig.from_dict(policy.task, strict=False)
    out = policy.evaluate(obs)
    scale = step_scale_rad(task, step.shape[-1])
    label = np.clip(step, -scale, scale)
    return action_to_step(task, out.action) - label


def _action_error(policy: EnsemblePolicy, obs: np.ndarray, step: np.ndarray) -> np.ndarray:
    """Per-sample, per-joint error of the policy's normalized action vs the label's action
    (`step_to_action` of the label step, clipped to ±0.98 as in training)."""
    task = TaskConfig.from_dict(policy.task, strict=False)
    out = policy.evaluate(obs)
    return np.clip(out.action, -1.0, 1.0) - np.clip(step_to_action(task, step), -0.98, 0.98)


LABELS = ("auto", "teacher", "commands")
FIT_SPACES = ("action", "step")


def resolve_labels(labels: str, task: TaskConfig) -> str:
    """`auto` -> `teacher` for the jerk-limited interface, `commands` for `step`; refuse
    `commands` for a jerk-limited policy (see the module docstring)."""
    if labels not in LABELS:
        raise FinetuneError(f"labels {labels!r}: expected one of {list(LABELS)}")
    if labels == "auto":
        return "teacher" if task.jerk_limited else "commands"
    if labels == "commands" and task.jerk_limited:
        raise FinetuneError(
            "labels 'commands' fits the action to the recorded command step, but this policy's "
            "jerk_limited action requests a command velocity (the step follows it under the "
            "jerk limit): the child would request what it already does. Use labels 'teacher'")
    return labels


def teacher_steps(trajectories: list[Trajectory], task: TaskConfig, arm: ArmModel,
                  gains: ExpertGains | None = None) -> list[np.ndarray]:
    """Per trajectory, the teacher's requested step (action_to_step of its action) at every
    recorded state, rad."""
    teacher = IKExpert(arm, task, gains)
    out = []
    for t in trajectories:
        if t.q is None or t.qd is None:
            raise FinetuneError(f"{t.bag}: a trajectory without measured states cannot be "
                                "relabelled by the teacher")
        act = teacher.act(t.q, np.broadcast_to(t.target_m, (len(t.q), 3)), t.qd)
        out.append(action_to_step(task, act))
    return out


def sim_anchor(
    policy: EnsemblePolicy,
    n_steps: int,
    spec: Any = None,
    seed: int = 0,
    calibration: Any = None,
    n_envs: int = 8,
) -> tuple[np.ndarray, np.ndarray]:
    """Roll the policy (ensemble mean) out in its simulator for `n_steps` control steps per
    environment and return (observations, the teacher's normalized actions there).

    `spec` is the randomization the policy trained under (default: `default`); `calibration`
    (PlantParams) the calibrated nominal plant, as `evaluate_in_sim` takes them.
    """
    from sim2real_ros.policy.env import ReachingVecEnv, load_spec
    from sim2real_ros.policy.train import _policy_action

    if n_steps < 1:
        raise FinetuneError(f"anchor steps = {n_steps}: expected at least 1")
    task = TaskConfig.from_dict(policy.task, strict=False)
    env = ReachingVecEnv(n_envs, task, spec if spec is not None else load_spec("default"),
                         seed=seed, calibration=calibration)
    obs_l: list[np.ndarray] = []
    act_l: list[np.ndarray] = []
    try:
        obs = env.reset()
        for _ in range(n_steps):
            obs_l.append(obs)
            act_l.append(env.expert_actions())
            obs = env.step(_policy_action(policy, obs)).obs
    finally:
        env.close()
    return np.concatenate(obs_l), np.concatenate(act_l)


def _default_arm() -> ArmModel:
    from sim2real_ros.paths import default_urdf
    from sim2real_ros.robot.model import load_arm

    return load_arm(default_urdf())


def _rms(err: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(err)))) if err.size else float("nan")


def finetune_last_layer(
    policy: EnsemblePolicy,
    trajectories: list[Trajectory],
    heldout_fraction: float = 0.2,
    seed: int = 0,
    epochs: int = 300,
    lr: float = 3e-3,
    l2_to_init: float = 1e-3,
    batch_size: int = 1024,
    labels: str = "auto",
    arm: ArmModel | None = None,
    fit_space: str = "step",
    anchor: tuple[np.ndarray, np.ndarray] | None = None,
    anchor_weight: float = 3.0,
) -> tuple[EnsemblePolicy, FinetuneReport]:
    """Return a child policy whose members' output layers fit the labels (module docstring)
    on the recorded states, and a report.

    `anchor` = (observations, normalized teacher actions) from the parent's own simulator
    (`sim_anchor`): rehearsed with weight `anchor_weight` (module docstring)."""
    if fit_space not in FIT_SPACES:
        raise FinetuneError(f"fit_space {fit_space!r}: expected one of {list(FIT_SPACES)}")
    if not (np.isfinite(anchor_weight) and anchor_weight >= 0.0):
        raise FinetuneError(f"anchor_weight = {anchor_weight}: expected a finite value >= 0")
    if anchor is not None:
        ao, aa = (np.asarray(x, dtype=float) for x in anchor)
        if ao.ndim != 2 or aa.ndim != 2 or len(ao) != len(aa) or len(ao) == 0:
            raise FinetuneError(f"anchor: expected (observations (N, D), actions (N, A)) with "
                                f"N > 0, got shapes {ao.shape} and {aa.shape}")
        if ao.shape[1] != policy.spec.obs_dim or aa.shape[1] != policy.spec.act_dim:
            raise FinetuneError(f"anchor: observations of {ao.shape[1]} and actions of "
                                f"{aa.shape[1]} values; the policy has {policy.spec.obs_dim} "
                                f"and {policy.spec.act_dim}")
        if not (np.all(np.isfinite(ao)) and np.all(np.isfinite(aa))):
            raise FinetuneError("anchor: non-finite observations or actions")
        anchor_label = np.clip(aa, -0.98, 0.98)  # as in training
    arm = arm or _default_arm()
    task0 = resolve_rate_limits(TaskConfig.from_dict(policy.task, strict=False), arm)
    labels = resolve_labels(labels, task0)
    if labels == "teacher":
        steps = teacher_steps(trajectories, task0, arm)
        trajectories = [replace(t, step_rad=s) for t, s in zip(trajectories, steps)]
    if not 0.0 < heldout_fraction < 1.0:
        raise ValueError(f"heldout_fraction = {heldout_fraction}: expected a value in (0, 1)")
    if len(trajectories) < 2:
        raise FinetuneError(f"{len(trajectories)} trajectories: need at least 2 "
                            "(one to train on, one held out)")
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(trajectories))
    n_held = min(len(trajectories) - 1, max(1, int(round(heldout_fraction * len(trajectories)))))
    held = [trajectories[i] for i in order[:n_held]]
    train_t = [trajectories[i] for i in order[n_held:]]
    xo = np.concatenate([t.obs for t in train_t])
    xs = np.concatenate([t.step_rad for t in train_t])
    ho = np.concatenate([t.obs for t in held])
    hs = np.concatenate([t.step_rad for t in held])

    child = copy.deepcopy(policy)
    task = TaskConfig.from_dict(child.task, strict=False)
    before_h = _step_error(child, ho, hs)
    before_t = _step_error(child, xo, xs)
    before_ha = _action_error(child, ho, hs)
    if anchor is not None:
        before_anchor = child.evaluate(ao).action - anchor_label

    net = child.net
    for p in net.parameters():
        p.requires_grad_(False)
    w, b = net.last_layer_parameters()
    w.requires_grad_(True)
    b.requires_grad_(True)
    w0, b0 = w.detach().clone(), b.detach().clone()
    with torch.no_grad():
        feats = net.features(child.normalize(torch.as_tensor(xo, dtype=torch.float32)))
    scale = step_scale_rad(task, xs.shape[-1])
    if fit_space == "action":
        target_np = np.clip(step_to_action(task, xs), -0.98, 0.98)
    else:
        target_np = np.clip(xs, -scale, scale) / scale
    target = torch.as_tensor(target_np, dtype=torch.float32)

    def in_fit_space(a: Any) -> Any:
        # normalized action, or normalized step (see task.action_to_step)
        return a if fit_space == "action" else a * abs(a)

    use_anchor = anchor is not None and anchor_weight > 0.0
    if use_anchor:
        with torch.no_grad():
            afeats = net.features(child.normalize(torch.as_tensor(ao, dtype=torch.float32)))
        atarget = torch.as_tensor(in_fit_space(anchor_label), dtype=torch.float32)
    opt = torch.optim.Adam([w, b], lr=lr)
    gen = torch.Generator().manual_seed(seed)
    n = feats.shape[1]
    members = child.spec.members
    steps_per_epoch = max(1, n // batch_size)
    for _ in range(epochs):
        for _ in range(steps_per_epoch):
            # Each member draws its own bootstrap minibatch, as in training.
            idx = torch.randint(0, n, (members, min(batch_size, n)), generator=gen)
            h = torch.gather(feats, 1, idx[..., None].expand(-1, -1, feats.shape[2]))
            pred = in_fit_space(torch.tanh(net.head(h)))
            loss = torch.mean((pred - target[idx]) ** 2) + l2_to_init * (
                torch.sum((w - w0) ** 2) + torch.sum((b - b0) ** 2)
            ) / members
            if use_anchor:
                na = afeats.shape[1]
                j = torch.randint(0, na, (members, min(batch_size, na)), generator=gen)
                ha = torch.gather(afeats, 1, j[..., None].expand(-1, -1, afeats.shape[2]))
                apred = in_fit_space(torch.tanh(net.head(ha)))
                loss = loss + anchor_weight * torch.mean((apred - atarget[j]) ** 2)
            opt.zero_grad()
            loss.backward()
            opt.step()
    w.requires_grad_(False)
    b.requires_grad_(False)

    after_h = _step_error(child, ho, hs)
    after_t = _step_error(child, xo, xs)
    after_ha = _action_error(child, ho, hs)
    anchor_stats: dict[str, Any] = {}
    if anchor is not None:
        after_anchor = child.evaluate(ao).action - anchor_label
        anchor_stats = {"n_anchor_samples": int(len(ao)), "anchor_weight": float(anchor_weight),
                        "anchor_before_action_rms": _rms(before_anchor),
                        "anchor_after_action_rms": _rms(after_anchor)}
    report = FinetuneReport(
        n_trajectories=len(trajectories),
        n_train=len(train_t),
        n_heldout=len(held),
        n_train_samples=int(xo.shape[0]),
        n_heldout_samples=int(ho.shape[0]),
        before_rms_rad=_rms(before_h),
        after_rms_rad=_rms(after_h),
        before_per_joint_rad=np.sqrt(np.mean(before_h**2, axis=0)).tolist(),
        after_per_joint_rad=np.sqrt(np.mean(after_h**2, axis=0)).tolist(),
        train_before_rms_rad=_rms(before_t),
        train_after_rms_rad=_rms(after_t),
        bags=sorted({t.bag for t in trajectories}),
        labels=labels,
        fit_space=fit_space,
        before_action_rms=_rms(before_ha),
        after_action_rms=_rms(after_ha),
        **anchor_stats,
    )
    report.bag_sha256 = _bags_sha256([Path(b) for b in report.bags])
    return child, report


# --- rehearsal data: a shifted "real" arm driven by a teacher, recorded as a real bag ------


@dataclass(frozen=True)
class TeacherShift:
    """How the rehearsal 'real' cell differs from the simulator the policy trained in."""

    speed_scale: float = 0.6  # the teacher moves at this fraction of the expert's speed
    k_integral_per_s: float = 6.0  # and converges with this gain
    payload_kg: float = 1.5  # the real arm carries this extra tool mass


def record_teacher_bag(
    path: str | Path,
    n_trajectories: int,
    seed: int = 0,
    shift: TeacherShift | None = None,
    task: TaskConfig | None = None,
    steps_per_trajectory: int = 80,
) -> Path:
    """Drive a shifted plant with a shifted IK teacher and record a rosbag2 (MCAP) bag.

    Topics: joint_states (JointState, at the control rate), task/target (PointStamped, at each
    new target), forward_position_controller/commands (Float64MultiArray). This is the
    rehearsal input for `sim2real policy finetune` and the test data of the fine-tune tests.
    """
    from sim2real_ros.sim.plant import ArmPlant, PlantParams
    from sim2real_ros.sysid import bags as bagio

    shift = shift or TeacherShift()
    task = task or TaskConfig()
    rng = np.random.default_rng(seed)
    plant = ArmPlant(params=PlantParams(payload_kg=shift.payload_kg))
    arm = plant.arm
    task = resolve_rate_limits(task, arm)
    slow = replace(task, max_step_rad=task.max_step_rad * shift.speed_scale,
                   max_velocity_rad_s=tuple(v * shift.speed_scale
                                            for v in task.max_velocity_rad_s))
    teacher = IKExpert(arm, slow, ExpertGains(k_integral_per_s=shift.k_integral_per_s))
    ts = bagio.typestore()
    point_t = ts.types["geometry_msgs/msg/PointStamped"]
    vec_t = ts.types["geometry_msgs/msg/Point"]
    header_t = ts.types["std_msgs/msg/Header"]
    time_t = ts.types["builtin_interfaces/msg/Time"]
    per_ctrl = max(1, int(round(task.dt_s / plant.physics_dt_s)))
    t_ns = 1_000_000_000
    dt_ns = int(round(task.dt_s * 1e9))
    try:
        with bagio.BagWriter(path, {"source": "sim2real_ros.policy.finetune.record_teacher_bag",
                                    "seed": seed, "shift": shift.__dict__}) as bag:
            bag.add_topic(JOINT_STATES, "sensor_msgs/msg/JointState")
            bag.add_topic(TARGET_TOPIC, "geometry_msgs/msg/PointStamped")
            bag.add_topic(COMMAND_TOPIC, "std_msgs/msg/Float64MultiArray")
            st = plant.reset(np.array(task.home_rad))
            hist = initial_history(st.q)
            for _ in range(n_trajectories):
                _, target = sample_episode(rng, task, arm)
                stamp = time_t(sec=t_ns // 1_000_000_000, nanosec=t_ns % 1_000_000_000)
                msg = point_t(header=header_t(stamp=stamp, frame_id=arm.root_link),
                              point=vec_t(x=float(target[0]), y=float(target[1]),
                                          z=float(target[2])))
                bag.write_msg(TARGET_TOPIC, t_ns, msg)
                for _ in range(steps_per_trajectory):
                    t_ns += dt_ns
                    bag.write_msg(JOINT_STATES, t_ns,
                                  bagio.joint_state_msg(arm.joint_names, t_ns, st.q, st.qd,
                                                        st.tau_nm))
                    a = teacher.act(st.q, target, st.qd)[0]
                    # The teacher's step in the slowed task, re-expressed in the policy's task.
                    step = action_to_step(slow, a)
                    hist = advance_command(task, arm, hist, st.q, step_to_action(task, step))
                    bag.write_msg(COMMAND_TOPIC, t_ns + 100_000, bagio.multiarray_msg(hist[0]))
                    plant.set_command("position", hist[0])
                    st = plant.step(per_ctrl)
    finally:
        plant.close()
    return Path(path)
