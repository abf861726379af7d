"""`sim2real sysid ...`: excite and record a unit, inspect bags, fit a calibration."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from sim2real_ros.config import ConfigError

FIT_ERRORS: tuple[type[BaseException], ...] = (ValueError, FileNotFoundError)


def register(subparsers: Any) -> None:
    """Add `sysid excite|record|info|fit|synth`."""
    sysid = subparsers.add_parser("sysid", help="system identification of the actual unit")
    sub = sysid.add_subparsers(dest="sysid_command", required=True)

    ex = sub.add_parser("excite", help="excite the arm through the safety filter and record a "
                        "bag (needs the running graph: sysid.launch.py or `sim2real run`)")
    _unit_args(ex)
    ex.add_argument("--kind", default="multisine", choices=["multisine", "chirp", "step"])
    ex.add_argument("--duration", type=float, default=20.0, help="excitation length, s")
    ex.add_argument("--amplitude", type=float, default=0.3, help="peak offset per joint, rad")
    ex.add_argument("--seed", type=int, default=0)
    ex.add_argument("--settle", type=float, default=2.0, help="hold before/after, s")
    ex.add_argument("--latency-probe", type=int, default=0, metavar="MOVES",
                    help="append a latency probe of MOVES moves from rest (a multiple of 6; "
                    "0 = none): the fit reads the command path's dead time there")
    ex.add_argument("--center", type=float, nargs="+", default=None,
                    help="centre pose per joint, rad (default: where the arm is)")
    ex.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                    help="any other sysid_recorder parameter (YAML value)")
    ex.set_defaults(func=_cmd_excite)

    rec = sub.add_parser("record", help="record topics of a live graph (no excitation)")
    _unit_args(rec)
    rec.add_argument("--duration", type=float, default=0.0, help="s; 0 = until Ctrl-C")
    rec.add_argument("--topics", nargs="+", default=None, help="topics ('name' or 'name:type')")
    rec.add_argument("--param", action="append", default=[], metavar="NAME=VALUE")
    rec.set_defaults(func=_cmd_record)

    info = sub.add_parser("info", help="show a bag's unit metadata, topics and counts")
    info.add_argument("bags", nargs="+", type=Path)
    info.add_argument("--json", action="store_true", help="print JSON")
    info.set_defaults(func=_cmd_info)

    fit = sub.add_parser("fit", help="fit the sim plant to recorded runs; write a calibration")
    fit.add_argument("bags", nargs="+", type=Path, help="bags of one unit (>= 3 runs advised)")
    fit.add_argument("-o", "--output", type=Path, required=True,
                     help="calibration file, e.g. config/calibration/<unit>.yaml")
    fit.add_argument("--force", action="store_true",
                     help="replace an existing calibration of the same unit")
    fit.add_argument("--unit", default=None, help="expected unit serial; refuse other bags")
    fit.add_argument("--report", type=Path, default=None, help="write report.md + PNGs here")
    fit.add_argument("--residual", type=Path, default=None,
                     help="also train a residual model and save it here (.pt)")
    fit.add_argument("--params", nargs="+", default=None,
                     help="parameter groups to fit (default: damping, friction, kp, mass, "
                     "inertia, payload, latency)")
    fit.add_argument("--hold-regression", nargs="+", default=None, metavar="GROUP",
                     help="groups taken from the effort regression (inverse dynamics on the "
                     "measured drive torques) and held there; the simulation fit then fits "
                     "only the other groups (the drive). Use when the simulator's servo is "
                     "not the unit's drive (docs/sysid.md)")
    fit.add_argument("--effort-lag-s", type=_lag_arg, default=0.0, metavar="S|auto",
                     help="the reported effort's lag behind the joint-state stamps, s: 0 "
                     "(default) for a drive that samples its torque at the stamp, half the "
                     "period for one that reports the period's mean; 'auto' estimates it as "
                     "the lag with the least effort-regression residual (docs/sysid.md)")
    fit.add_argument("--debias-regression", choices=["auto", "on", "off"], default="auto",
                     help="debias the effort regression through the simulator's replay, which "
                     "samples efforts at the stamps (auto: when the effort lag is under a "
                     "quarter period; docs/sysid.md)")
    fit.add_argument("--latency-from", choices=["auto", "probe", "fit"], default="auto",
                     help="the action latency: 'probe' reads the dead time at the latency "
                     "probe's moves from rest (record with `excite --latency-probe N`) and "
                     "holds it; 'fit' fits it with the drive; auto: probe when the bags carry "
                     "one (docs/sysid.md)")
    fit.add_argument("--validation-runs", nargs="+", default=None,
                     help="bag names held out (default: the last third)")
    fit.add_argument("--max-iterations", type=int, default=10)
    fit.add_argument("--solver", choices=["lm", "trf"], default="lm",
                     help="bounded Levenberg-Marquardt (default) or scipy's trust region")
    fit.add_argument("--window", type=float, default=0.3, help="shooting window, s")
    fit.add_argument("--window-every", type=float, default=1.0, help="window spacing, s")
    fit.add_argument("--joint-states-topic", default="joint_states")
    fit.add_argument("--command-topic", default="forward_position_controller/commands")
    fit.add_argument("--urdf", type=Path, default=None)
    fit.add_argument("--no-progress", action="store_true")
    fit.set_defaults(func=_cmd_fit)

    syn = sub.add_parser("synth", help="make synthetic 'real' bags from the sim plant with "
                         "hidden parameters (for trying the pipeline and benchmarks)")
    syn.add_argument("out_dir", type=Path)
    syn.add_argument("--unit", default="SYNTH-0001")
    syn.add_argument("--runs", type=int, default=3)
    syn.add_argument("--duration", type=float, default=20.0)
    syn.add_argument("--seed", type=int, default=0)
    syn.set_defaults(func=_cmd_synth)


def _unit_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--unit", required=True, help="serial of the arm")
    p.add_argument("--cell", default="")
    p.add_argument("--tool", default="")
    p.add_argument("--note", default="", help="operator note stored in the bag")
    p.add_argument("--output-dir", default="bags")
    p.add_argument("--run-name", default="")


def _recorder_params(args: argparse.Namespace, extra: dict[str, Any]) -> dict[str, Any]:
    params: dict[str, Any] = {
        "unit_serial": args.unit, "unit_cell": args.cell, "unit_tool": args.tool,
        "operator_note": args.note, "output_dir": str(args.output_dir),
        "run_name": args.run_name, "exit_when_done": True,
    }
    params.update(extra)
    for item in args.param:
        name, sep, value = item.partition("=")
        if not sep:
            raise ConfigError("<command line>", "--param", item, "NAME=VALUE")
        params[name] = yaml.safe_load(value)
    return params


def _run_recorder(params: dict[str, Any]) -> int:
    from sim2real_ros.sysid.node import NODE_NAME, main

    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as fh:
        yaml.safe_dump({NODE_NAME: {"ros__parameters": params}}, fh)
        path = fh.name
    try:
        return main(["--ros-args", "--params-file", path])
    finally:
        Path(path).unlink(missing_ok=True)


def _cmd_excite(args: argparse.Namespace) -> int:
    extra: dict[str, Any] = {"excitation": args.kind, "duration_s": args.duration,
                             "amplitude_rad": args.amplitude, "seed": args.seed,
                             "settle_s": args.settle,
                             "latency_probe_moves": args.latency_probe}
    if args.center:
        extra["center_rad"] = [float(v) for v in args.center]
    return _run_recorder(_recorder_params(args, extra))


def _cmd_record(args: argparse.Namespace) -> int:
    extra: dict[str, Any] = {"excitation": "none", "duration_s": args.duration}
    if args.topics:
        extra["topics"] = list(args.topics)
    return _run_recorder(_recorder_params(args, extra))


def _cmd_info(args: argparse.Namespace) -> int:
    from sim2real_ros.sysid import bags

    out = []
    for b in args.bags:
        try:
            info = bags.bag_info(b)
        except bags.BagError as exc:
            print(f"sim2real sysid info: error: {exc}", file=sys.stderr)
            return 2
        out.append({"bag": str(b), "status": info.status, "metadata": info.metadata,
                    "duration_s": info.duration_ns * 1e-9, "messages": info.message_count,
                    "topics": {t: {"type": i.msgtype, "count": i.count}
                               for t, i in info.topics.items()}})
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for o in out:
            unit = o["metadata"].get("unit", {})
            print(f"{o['bag']}: unit {unit.get('serial', '?')} ({unit.get('cell', '')}, "
                  f"{unit.get('tool', '')}), {o['duration_s']:.2f} s, {o['messages']} messages, "
                  f"status {o['status']}")
            for t, i in sorted(o["topics"].items()):
                print(f"  {t:50s} {i['type']:40s} {i['count']}")
    return 0


def _lag_arg(text: str) -> float | None:
    """--effort-lag-s: 'auto' (None: estimate) or seconds in [0, 0.1]."""
    if text.strip().lower() == "auto":
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--effort-lag-s {text!r}: expected seconds in [0, 0.1] or 'auto'") from None
    if not (0.0 <= value <= 0.1):
        raise argparse.ArgumentTypeError(
            f"--effort-lag-s {text!r}: expected seconds in [0, 0.1] or 'auto'")
    return value


def _error(msg: str) -> int:
    print(f"sim2real sysid fit: error: {msg}", file=sys.stderr)
    return 2


def _cmd_fit(args: argparse.Namespace) -> int:
    from sim2real_ros.sim.plant import ArmPlant
    from sim2real_ros.sysid import calibration as cal
    from sim2real_ros.sysid.fit import DEFAULT_GROUPS, FitError, FitOptions, fit
    from sim2real_ros.sysid.runs import check_same_unit, load_run

    out: Path = args.output
    # Refuse before the expensive part: an existing file is replaced only with --force, and
    # never by a calibration of another unit.
    existing = None
    if out.exists():
        if not args.force:
            return _error(f"{out} exists; use --force to replace it (nothing was written)")
        try:
            existing = cal.load_calibration(out)
        except ConfigError:
            existing = None
    plant = ArmPlant(urdf_path=args.urdf)
    try:
        runs = []
        for b in args.bags:
            try:
                runs.append(load_run(b, plant.joint_names, args.joint_states_topic,
                                     args.command_topic))
            except FIT_ERRORS as exc:
                return _error(f"{exc} (nothing was written)")
        try:
            serial = check_same_unit(runs)
        except ValueError as exc:
            return _error(f"{exc} (nothing was written)")
        if not serial:
            return _error("the bags name no unit serial (metadata unit.serial); nothing written")
        if args.unit is not None and args.unit != serial:
            return _error(f"bags are from unit '{serial}', expected --unit '{args.unit}' "
                          "(nothing was written)")
        if existing is not None and existing.unit_id != serial:
            return _error(f"{out} is the calibration of unit '{existing.unit_id}', the bags are "
                          f"from '{serial}'; refusing to replace it even with --force")
        names = [r.name for r in runs]
        if len(set(names)) != len(names):
            return _error(f"two bags share a name {names}; bag names identify runs")
        opts = FitOptions(
            groups=tuple(args.params) if args.params else DEFAULT_GROUPS,
            window_s=args.window, window_every_s=args.window_every,
            max_iterations=args.max_iterations, solver=args.solver,
            validation_runs=tuple(args.validation_runs) if args.validation_runs else None,
            progress=not args.no_progress,
            hold_regression=tuple(args.hold_regression or ()),
            effort_lag_s=args.effort_lag_s,
            debias_regression={"auto": None, "on": True, "off": False}[args.debias_regression],
            latency_source=args.latency_from,
        )
        try:
            result = fit(runs, opts, plant=plant, log=lambda m: print(f"[sysid] {m}"))
        except FitError as exc:
            return _error(f"{exc} (nothing was written)")
        unit = dict(runs[0].metadata.get("unit", {}))
        unit["envelope_sha256"] = runs[0].metadata.get("envelope_sha256", "")
        data = cal.calibration_dict(result, unit, names)
        residual_report = None
        if args.residual is not None:
            from sim2real_ros.sysid.residual import train_residual

            train = [r for r in runs if r.name in result.train_runs]
            test = [r for r in runs if r.name in result.validation_runs] or train
            model, residual_report = train_residual(plant, train, test, result.params,
                                                    result.action_latency_s)
            data["residual"] = {
                "path": str(args.residual),
                "held_out_rms_q_sim_rad": residual_report.rms_q_sim_rad,
                "held_out_rms_q_corrected_rad": residual_report.rms_q_corrected_rad,
            }
        written = cal.write_calibration(data, out, force=args.force)
        if args.residual is not None:
            model.save(args.residual)
        print(f"[sysid] calibration written: {written}")
        print(f"[sysid] held-out rollout RMS error: nominal "
              f"{result.error_nominal.rms_q_total_rad:.4g} rad, calibrated "
              f"{result.error_calibrated.rms_q_total_rad:.4g} rad "
              f"({result.improvement:.1f}x)")
        if args.report is not None:
            from sim2real_ros.sysid.report import write_report

            md = write_report(result, args.report, unit, written, residual_report)
            print(f"[sysid] report: {md}")
        return 0
    finally:
        plant.close()


def _cmd_synth(args: argparse.Namespace) -> int:
    import numpy as np

    from sim2real_ros.sim.plant import ArmPlant
    from sim2real_ros.sysid import excitation as ex
    from sim2real_ros.sysid import synth

    hidden, latency = synth.default_hidden_unit()
    plant = ArmPlant()
    try:
        env = ex.ExcitationEnvelope.from_arm(plant.arm, velocity_fraction=0.4,
                                             max_acceleration_rad_s2=6.0)
        center = ex.default_center(env)
        args.out_dir.mkdir(parents=True, exist_ok=True)
        for i in range(args.runs):
            exc = ex.make_excitation("multisine", center, env, args.duration, 0.4,
                                     seed=args.seed + i)
            run = synth.synthesize_run(plant, synth.run_variation(hidden, i, args.seed), exc,
                                       latency_s=latency, seed=args.seed + 100 + i,
                                       name=f"run{i}")
            path = args.out_dir / f"{args.unit}_run{i}"
            synth.write_run_bag(path, run, synth.synthetic_metadata(args.unit, i, exc))
            print(f"wrote {path}")
        truth = {"latency_s": latency, "plant": hidden.to_dict()}
        (args.out_dir / "hidden_truth.yaml").write_text(yaml.safe_dump(
            json.loads(json.dumps(truth, default=lambda o: np.asarray(o).tolist()))))
        return 0
    finally:
        plant.close()
