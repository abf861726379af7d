"""`sim2real train` and `sim2real policy list|promote|rollback|finetune|verify|eval|record-sim`."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from sim2real_ros.config import ConfigError


def _registry(args: argparse.Namespace) -> Any:
    from sim2real_ros.policy.registry import PolicyRegistry

    return PolicyRegistry(args.registry)


def _add_registry_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--registry", default=None, metavar="DIR",
                   help="registry root (default: $SIM2REAL_POLICY_REGISTRY or "
                        "~/.local/share/sim2real_ros/policies)")


def _cmd_train(args: argparse.Namespace) -> int:
    import torch

    from sim2real_ros.policy.train import TrainConfig, train, write_run

    torch.set_num_threads(args.threads)
    cfg = TrainConfig(
        algo=args.algo, seed=args.seed, n_envs=args.envs, randomization=args.randomization,
        hidden=tuple(args.hidden), members=args.members, dagger_iterations=args.iterations,
        steps_per_iteration=args.steps_per_iteration, ppo_iterations=args.ppo_iterations,
        eval_episodes=args.eval_episodes, time_budget_s=args.time_budget_s,
        iteration_eval_episodes=args.iteration_eval_episodes,
    )
    cfg.validate("sim2real train arguments")
    res = train(cfg, progress=not args.no_progress, log=None if not args.no_progress else print)
    out = Path(args.out or f"runs/policy-{cfg.algo.replace('+', '-')}-seed{cfg.seed}-"
                              f"{time.strftime('%Y%m%d-%H%M%S')}")
    paths = write_run(res, out)
    print(f"sim success {res.sim_success:.3f} on {cfg.eval_episodes} fresh randomized episodes; "
          f"wall {res.wall_s:.1f} s; {res.env_steps} env steps")
    print(f"learning curve: {paths['curve']}")
    if not args.no_register:
        reg = _registry(args)
        rec = reg.add(res.policy, {"run_dir": str(out.resolve())}, parent=args.parent)
        print(f"registered version {rec.version} (sha256 {rec.sha256}) in {reg.root}")
        if args.promote:
            reg.promote(rec.version, reason=f"sim2real train --promote (sim success "
                                            f"{res.sim_success:.3f})")
            print(f"promoted version {rec.version} to known-good")
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    reg = _registry(args)
    kg = reg.known_good
    rows = []
    for rec in reg.versions():
        m = rec.metadata
        rows.append({
            "version": rec.version, "known_good": rec.version == kg, "parent": rec.parent,
            "sha256": rec.sha256, "created_utc": rec.created_utc,
            "sim_success": m.get("sim_success"), "seed": m.get("seed"),
            "randomization_sha256": m.get("randomization_sha256", ""),
            "source": m.get("source") or ("finetune" if "finetune" in m else "train"),
        })
    if args.json:
        print(json.dumps({"registry": str(reg.root), "known_good": kg, "versions": rows},
                         indent=2))
        return 0
    print(f"registry {reg.root}  (known-good: {kg})")
    print(f"{'ver':>4} {'kg':2} {'parent':>6} {'sim_succ':>8} {'seed':>5}  {'source':15} "
          f"{'sha256':14} created")
    for r in rows:
        succ = r["sim_success"]
        print(f"{r['version']:>4} {'*' if r['known_good'] else ' ':2} "
              f"{'' if r['parent'] is None else r['parent']:>6} "
              f"{'' if succ is None else f'{succ:.3f}':>8} "
              f"{'' if r['seed'] is None else r['seed']:>5}  {str(r['source'])[:15]:15} "
              f"{r['sha256'][:12]}.. {r['created_utc']}")
    return 0


def _cmd_promote(args: argparse.Namespace) -> int:
    reg = _registry(args)
    rec = reg.promote(args.version, reason=args.reason)
    print(f"version {rec.version} is now known-good ({args.reason})")
    return 0


def _cmd_rollback(args: argparse.Namespace) -> int:
    reg = _registry(args)
    before = reg.known_good
    rec = reg.rollback(reason=args.reason)
    print(f"known-good rolled back from version {before} to {rec.version} ({args.reason})")
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from sim2real_ros.policy.registry import PolicyIntegrityError

    reg = _registry(args)
    versions = [r.version for r in reg.versions()] if args.version is None else [args.version]
    bad = 0
    for v in versions:
        try:
            rec = reg.verify(v)
            print(f"version {rec.version}: ok (sha256 {rec.sha256})")
        except PolicyIntegrityError as exc:
            bad += 1
            print(f"version {v}: REFUSED: {exc}")
    return 1 if bad else 0


def _cmd_eval(args: argparse.Namespace) -> int:
    import torch

    from sim2real_ros.policy.env import load_simulator
    from sim2real_ros.policy.task import TaskConfig
    from sim2real_ros.policy.train import evaluate_in_sim

    torch.set_num_threads(1)
    reg = _registry(args)
    policy, rec = reg.load(args.version)
    task = TaskConfig.from_dict(policy.task, strict=False)
    spec, nominal = load_simulator(args.randomization)
    ev = evaluate_in_sim(policy, args.episodes, task, spec, args.seed, calibration=nominal)
    print(f"version {rec.version}: success {ev.success_rate:.3f} over {ev.episodes} episodes "
          f"(randomization {args.randomization}, seed {args.seed}); mean time to success "
          f"{ev.mean_steps_to_success * task.dt_s:.2f} s; mean return {ev.mean_return:.2f}")
    return 0


def _cmd_finetune(args: argparse.Namespace) -> int:
    import torch

    from sim2real_ros.paths import default_urdf
    from sim2real_ros.policy.finetune import finetune_last_layer, load_trajectories
    from sim2real_ros.policy.task import TaskConfig
    from sim2real_ros.robot.model import load_arm

    torch.set_num_threads(1)
    reg = _registry(args)
    policy, rec = reg.load(args.version)
    task = TaskConfig.from_dict(policy.task, strict=False)
    arm = load_arm(default_urdf())
    trajs = load_trajectories(args.bags, task, arm, args.command_topic, args.target_topic,
                              args.joint_topic)
    anchor = None
    anchor_source = ""
    if args.anchor_steps < 0:
        raise SystemExit(f"--anchor-steps {args.anchor_steps}: expected >= 0 (0 = no rehearsal)")
    if args.anchor_steps:
        from sim2real_ros.policy.env import load_spec
        from sim2real_ros.policy.finetune import sim_anchor

        if args.anchor_calibration:
            from sim2real_ros.sim.randomization import load_calibration

            nominal, spec = load_calibration(args.anchor_calibration)
            anchor_source = f"calibration {args.anchor_calibration}"
        else:
            nominal, spec = None, load_spec(args.anchor_randomization)
            anchor_source = f"randomization {args.anchor_randomization}"
        print(f"rehearsal: rolling the parent out for {args.anchor_steps} steps x 8 envs in its "
              f"simulator ({anchor_source})", flush=True)
        anchor = sim_anchor(policy, args.anchor_steps, spec, seed=args.seed + 17,
                            calibration=nominal)
    child, rep = finetune_last_layer(policy, trajs, args.heldout, args.seed, args.epochs,
                                     labels=args.labels, arm=arm, fit_space=args.fit_space,
                                     anchor=anchor, anchor_weight=args.anchor_weight)
    meta: dict[str, Any] = {
        "source": "finetune",
        "finetune": {**rep.to_dict(), "parent_version": rec.version, "seed": args.seed,
                     "epochs": args.epochs, "command_topic": args.command_topic,
                     "anchor_steps": args.anchor_steps, "anchor_source": anchor_source,
                     "labels": rep.labels,
                     "layers_changed": "last"},
        "seed": args.seed,
        "sim_success": None,
    }
    if args.sim_eval_episodes:
        from sim2real_ros.policy.env import load_spec
        from sim2real_ros.policy.train import evaluate_in_sim

        ev = evaluate_in_sim(child, args.sim_eval_episodes, task, load_spec("default"),
                             args.seed)
        meta["sim_success"] = ev.success_rate
        meta["sim_eval_episodes"] = args.sim_eval_episodes
    new = reg.add(child, meta, parent=rec.version)
    print(f"fine-tuned version {rec.version} on {rep.n_train} trajectories "
          f"({rep.n_train_samples} samples) from {len(rep.bags)} bag(s)")
    print(f"labels: {rep.labels}, fit space: {rep.fit_space}")
    print(f"held-out ({rep.n_heldout} trajectories, {rep.n_heldout_samples} samples) RMS "
          f"joint-command error: before {rep.before_rms_rad * 1e3:.3f} mrad, after "
          f"{rep.after_rms_rad * 1e3:.3f} mrad")
    print(f"held-out RMS normalized-action error: before {rep.before_action_rms:.4f}, after "
          f"{rep.after_action_rms:.4f}")
    print("per joint before [mrad]: " + " ".join(f"{v * 1e3:.3f}" for v in
                                                 rep.before_per_joint_rad))
    print("per joint after  [mrad]: " + " ".join(f"{v * 1e3:.3f}" for v in
                                                 rep.after_per_joint_rad))
    if rep.n_anchor_samples:
        print(f"rehearsal: {rep.n_anchor_samples} samples of the parent in its simulator "
              f"(weight {rep.anchor_weight:g}), action error there before "
              f"{rep.anchor_before_action_rms:.4f}, after {rep.anchor_after_action_rms:.4f}")
    if meta["sim_success"] is not None:
        print(f"sim success of the child: {meta['sim_success']:.3f}")
    print(f"registered child version {new.version} (parent {rec.version}, sha256 {new.sha256})")
    if args.promote:
        reg.promote(new.version, reason="sim2real policy finetune --promote")
        print(f"promoted version {new.version} to known-good")
    return 0


def _cmd_record_sim(args: argparse.Namespace) -> int:
    from sim2real_ros.policy.finetune import TeacherShift, record_teacher_bag

    shift = TeacherShift(args.speed_scale, args.k_integral, args.payload_kg)
    if not 0.05 <= shift.speed_scale <= 1.0:
        raise ConfigError("sim2real policy record-sim", "--speed-scale", shift.speed_scale,
                          "a number in [0.05, 1.0]")
    path = record_teacher_bag(args.out, args.trajectories, args.seed, shift,
                              steps_per_trajectory=args.steps)
    print(f"wrote {path} ({args.trajectories} trajectories, shift {shift})")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add `train` and `policy ...` to the sim2real command."""
    from sim2real_ros.policy.train_config import ALGOS, TrainConfig

    d = TrainConfig()
    t = subparsers.add_parser(
        "train", help="train a reaching policy in the randomized simulator",
        description="Train in the randomized sim core (no ROS): BC + DAgger from the IK "
                    "expert and/or PPO; writes the learning curve and a new registry version.")
    t.add_argument("--algo", choices=ALGOS, default=d.algo)
    t.add_argument("--seed", type=int, default=d.seed)
    t.add_argument("--envs", type=int, default=d.n_envs, help="simulator instances")
    t.add_argument("--iterations", type=int, default=d.dagger_iterations,
                   help="BC + DAgger iterations")
    t.add_argument("--steps-per-iteration", type=int, default=d.steps_per_iteration,
                   help="control steps per environment per DAgger iteration")
    t.add_argument("--ppo-iterations", type=int, default=d.ppo_iterations)
    t.add_argument("--members", type=int, default=d.members, help="ensemble members")
    t.add_argument("--hidden", type=int, nargs="+", default=list(d.hidden))
    t.add_argument("--randomization", default=d.randomization,
                   help="'default' (config/randomization.yaml), 'none', a spec file, or a "
                        "calibration file from `sim2real sysid fit` (trains in the calibrated "
                        "simulator: its nominal plant and its ranges)")
    t.add_argument("--eval-episodes", type=int, default=d.eval_episodes,
                   help="fresh episodes of the final evaluation (the recorded sim success)")
    t.add_argument("--iteration-eval-episodes", type=int, default=d.iteration_eval_episodes,
                   help="learner-only episodes evaluated after every iteration (0 = off)")
    t.add_argument("--time-budget-s", type=float, default=0.0,
                   help="stop starting new iterations after this many seconds (0 = none)")
    t.add_argument("--threads", type=int, default=1, help="torch threads")
    t.add_argument("--out", default=None, help="run directory (policy, curve, history)")
    t.add_argument("--parent", type=int, default=None, help="parent version to record")
    t.add_argument("--promote", action="store_true", help="promote the new version")
    t.add_argument("--no-register", action="store_true", help="do not add to the registry")
    t.add_argument("--no-progress", action="store_true", help="plain log lines, no bar")
    _add_registry_arg(t)
    t.set_defaults(func=_cmd_train)

    p = subparsers.add_parser("policy", help="policy registry: list, promote, rollback, "
                                             "finetune, verify, eval, record-sim")
    sub = p.add_subparsers(dest="policy_command", required=True)

    c = sub.add_parser("list", help="list versions and the known-good pointer")
    c.add_argument("--json", action="store_true")
    _add_registry_arg(c)
    c.set_defaults(func=_cmd_list)

    c = sub.add_parser("promote", help="make a version the known-good one")
    c.add_argument("version", type=int)
    c.add_argument("--reason", default="promoted by sim2real policy promote")
    _add_registry_arg(c)
    c.set_defaults(func=_cmd_promote)

    c = sub.add_parser("rollback", help="move known-good back to the previously promoted version")
    c.add_argument("--reason", required=True, help="why (recorded in the registry log)")
    _add_registry_arg(c)
    c.set_defaults(func=_cmd_rollback)

    c = sub.add_parser("verify", help="check versions' sha256 against the registry")
    c.add_argument("version", type=int, nargs="?", default=None)
    _add_registry_arg(c)
    c.set_defaults(func=_cmd_verify)

    c = sub.add_parser("eval", help="success rate of a version in the randomized simulator")
    c.add_argument("--version", type=int, default=0, help="0 = known-good")
    c.add_argument("--episodes", type=int, default=100)
    c.add_argument("--seed", type=int, default=12345)
    c.add_argument("--randomization", default="default",
                   help="as for train: 'default', 'none', a spec file or a calibration file")
    _add_registry_arg(c)
    c.set_defaults(func=_cmd_eval)

    c = sub.add_parser(
        "finetune", help="fit only the last layer to real trajectories (rosbag2 MCAP)",
        description="Fit the members' output layers to the commands recorded in the bags; "
                    "writes a child version and reports held-out error before/after.")
    c.add_argument("bags", nargs="+", help="rosbag2 bag directories")
    c.add_argument("--version", type=int, default=0, help="parent version (0 = known-good)")
    c.add_argument("--command-topic", default="forward_position_controller/commands",
                   help="Float64MultiArray (what reached the arm) or a stamped JointState "
                        "command topic such as baseline/joint_command")
    c.add_argument("--target-topic", default="task/target")
    c.add_argument("--joint-topic", default="joint_states")
    c.add_argument("--heldout", type=float, default=0.2, help="fraction of trajectories held out")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--epochs", type=int, default=300)
    c.add_argument("--labels", choices=("auto", "teacher", "commands"), default="auto",
                   help="what the last layer learns: the IK teacher's action at each recorded "
                   "state (teacher), or the recorded command steps (commands, step interface "
                   "only); auto = teacher for jerk-limited policies (docs/policy.md)")
    c.add_argument("--fit-space", choices=("action", "step"), default="step",
                   help="compare the normalized step a|a| (default) or the normalized action (the "
                   "training space; did worse on the proxy, docs/proxy.md run 12)")
    c.add_argument("--anchor-steps", type=int, default=0,
                   help="rehearsal: roll the parent out this many steps (x 8 envs) in its own "
                   "simulator and keep fitting the teacher there (0 = off; docs/policy.md)")
    c.add_argument("--anchor-weight", type=float, default=3.0,
                   help="weight of the rehearsal batch in the loss, relative to the recorded batch")
    c.add_argument("--anchor-calibration", default=None,
                   help="calibration.yaml of the parent's simulator (a calibrated policy)")
    c.add_argument("--anchor-randomization", default="default",
                   help="randomization spec of the parent's simulator without a calibration")
    c.add_argument("--sim-eval-episodes", type=int, default=50,
                   help="also measure the child's sim success (0 = skip)")
    c.add_argument("--promote", action="store_true")
    _add_registry_arg(c)
    c.set_defaults(func=_cmd_finetune)

    c = sub.add_parser(
        "record-sim", help="record rehearsal bags: a shifted sim arm driven by an IK teacher")
    c.add_argument("out", help="bag directory to create")
    c.add_argument("--trajectories", type=int, default=200)
    c.add_argument("--steps", type=int, default=80, help="control steps per trajectory")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--speed-scale", type=float, default=0.6)
    c.add_argument("--k-integral", type=float, default=6.0)
    c.add_argument("--payload-kg", type=float, default=1.5)
    c.set_defaults(func=_cmd_record_sim)
