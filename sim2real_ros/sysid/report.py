"""Fit report: markdown with PNG plots (per-joint fit, held-out error, parameter confidence)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from sim2real_ros.sysid.fit import FitResult


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_joint_fit(result: FitResult, path: Path) -> Path:
    """Plot one held-out rollout per joint: measured, nominal sim, calibrated sim."""
    plt = _plt()
    nom, cal = result.traces.get("nominal", []), result.traces.get("calibrated", [])
    if not nom:
        raise ValueError("the fit result has no rollout traces")
    # the rollout where calibration matters most is the most informative one to show
    gains = [np.sqrt(np.mean((a["q_sim"] - a["q_meas"]) ** 2)) for a in nom]
    i = int(np.argmax(gains))
    a, b = nom[i], cal[i]
    n = len(result.joint_names)
    fig, axes = plt.subplots(n, 1, figsize=(8, 1.6 * n), sharex=True)
    t = a["t_s"] - a["t_s"][0]
    for j, ax in enumerate(np.atleast_1d(axes)):
        ax.plot(t, a["q_meas"][:, j], "k-", lw=1.2, label="measured")
        ax.plot(t, a["q_sim"][:, j], "C3--", lw=1.0, label="nominal sim")
        ax.plot(t, b["q_sim"][:, j], "C0-", lw=1.0, label="calibrated sim")
        ax.set_ylabel(f"{result.joint_names[j]}\n[rad]", fontsize=7)
        ax.tick_params(labelsize=7)
    np.atleast_1d(axes)[0].legend(fontsize=7, ncol=3, loc="upper right")
    np.atleast_1d(axes)[-1].set_xlabel("time in held-out rollout [s]")
    fig.suptitle("Open-loop rollout from a measured state (held-out run)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_rollout_error(result: FitResult, path: Path) -> Path:
    """Bar chart of held-out rollout RMS error per joint, nominal vs calibrated."""
    plt = _plt()
    n = len(result.joint_names)
    x = np.arange(n)
    fig, ax = plt.subplots(figsize=(8, 3))
    ax.bar(x - 0.2, result.error_nominal.rms_q_rad, 0.4, label="nominal", color="C3")
    ax.bar(x + 0.2, result.error_calibrated.rms_q_rad, 0.4, label="calibrated", color="C0")
    ax.set_yscale("log")
    ax.set_xticks(x, [j.replace("_joint", "") for j in result.joint_names], fontsize=7)
    ax.set_ylabel("RMS position error [rad]")
    ax.set_title(f"Held-out rollout error ({result.error_nominal.n_rollouts} rollouts): "
                 f"{result.improvement:.1f}x lower after calibration", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_confidence(result: FitResult, path: Path) -> Path:
    """Fitted values with ±2σ (fit) and ±2σ (run to run), relative to the base value."""
    plt = _plt()
    names = list(result.fitted)
    base = {d.name: d for d in result.defs}
    vals, err, spr = [], [], []
    from sim2real_ros.sysid.fit import get_value

    for name in names:
        d = base[name]
        ref = abs(get_value(result.base_params, 0.0, d)) or d.typical
        vals.append(result.fitted[name] / ref)
        err.append(2 * result.std.get(name, 0.0) / ref)
        spr.append(2 * result.spread.get(name, 0.0) / ref)
    y = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(8, 0.25 * len(names) + 1.2))
    ax.errorbar(vals, y + 0.15, xerr=spr, fmt="none", ecolor="C1", elinewidth=3, alpha=0.5,
                label="±2σ run to run")
    ax.errorbar(vals, y, xerr=err, fmt="o", color="C0", ms=3, label="fit ±2σ")
    ax.axvline(1.0, color="k", lw=0.5)
    ax.set_yticks(y, names, fontsize=6)
    ax.set_xlabel("fitted / base value (latency, friction: / typical magnitude)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_dead_time(dead: dict[str, Any], path: Path) -> Path:
    """The latency probe: the dead time read at each onset, by run, with the median."""
    plt = _plt()
    onsets = dead["onsets"]
    runs = sorted({o["run"] for o in onsets})
    fig, ax = plt.subplots(figsize=(9, 2.8))
    for k, run in enumerate(runs):
        v = [1e3 * o["dead_time_s"] for o in onsets if o["run"] == run]
        spread = np.linspace(-0.15, 0.15, len(v)) if len(v) > 1 else np.zeros(1)
        ax.plot(k + spread, v, "o", ms=4,
                color=f"C{k % 10}", label=run)
    med = 1e3 * dead["dead_time_s"]
    ax.axhline(med, color="k", lw=1.0, label=f"median {med:.2f} ms")
    ax.set_xticks(range(len(runs)), runs, fontsize=7)
    ax.set_ylabel("dead time [ms]")
    ax.set_title(f"Latency probe: dead time at {len(onsets)} moves from rest", fontsize=9)
    ax.set_xlim(-0.5, len(runs) - 0.5)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside, not over
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(
    result: FitResult,
    out_dir: str | Path,
    unit: dict[str, Any],
    calibration_path: str | Path | None = None,
    residual: Any | None = None,
) -> Path:
    """Write report.md and its PNGs into out_dir; return the markdown path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    f1 = plot_joint_fit(result, out / "joint_fit.png")
    f2 = plot_rollout_error(result, out / "rollout_error.png")
    f3 = plot_confidence(result, out / "parameter_confidence.png")
    lines = [
        f"# System identification report: unit {unit.get('serial', '?')}",
        "",
        f"Cell: {unit.get('cell', '')} · tool: {unit.get('tool', '')} · "
        f"training runs: {', '.join(result.train_runs)} · validation runs: "
        f"{', '.join(result.validation_runs) or '(none: in-sample)'}",
        "",
    ]
    if calibration_path:
        lines += [f"Calibration written to `{calibration_path}`.", ""]
    en, ec = result.error_nominal, result.error_calibrated
    lines += [
        "## Held-out rollout error",
        "",
        f"{en.n_rollouts} open-loop rollouts from measured states on the validation runs.",
        "",
        "| joint | nominal RMS [rad] | calibrated RMS [rad] | ratio |",
        "|---|---|---|---|",
    ]
    for j, name in enumerate(result.joint_names):
        lines.append(f"| {name} | {en.rms_q_rad[j]:.3g} | {ec.rms_q_rad[j]:.3g} | "
                     f"{en.rms_q_rad[j] / max(ec.rms_q_rad[j], 1e-15):.1f} |")
    lines += [f"| **all** | {en.rms_q_total_rad:.3g} | {ec.rms_q_total_rad:.3g} | "
              f"**{result.improvement:.1f}** |", "", f"![rollout error]({f2.name})", "",
              "## Per-joint fit", "", f"![joint fit]({f1.name})", "",
              "## Latency", "",
              f"- action latency (cross-correlation, first): "
              f"{result.latency.action_latency_s * 1e3:.2f} ms",
              f"- action latency (after the fit): {result.action_latency_s * 1e3:.2f} ms",
              f"- command-to-response lag (latency + servo lag): "
              f"{result.latency.response_lag_s * 1e3:.1f} ms"]
    if result.observation_latency_s is not None:
        lines.append(f"- observation age at the recorder: "
                     f"{result.observation_latency_s * 1e3:.2f} ms")
    dead = result.dead_time
    if dead is not None:
        f4 = plot_dead_time(dead, out / "latency_probe.png")
        how = ("the calibration's action latency, held in the fit"
               if result.latency_source == "probe" else "reported; the fit fitted the latency")
        lines += [f"- dead time at the latency probe: {dead['dead_time_s'] * 1e3:.2f} ms "
                  f"({how}): median of {dead['n_onsets']} moves from rest, spread "
                  f"{dead['spread_s'] * 1e3:.2f} ms, standard error "
                  f"{dead['stderr_s'] * 1e3:.2f} ms; per run "
                  + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in dead["per_run_s"].items()),
                  "", f"![latency probe]({f4.name})", ""]
        if dead.get("skipped"):
            lines.append(f"- probe onsets left out: {'; '.join(dead['skipped'])}")
    lines += ["", "## Effort regression", ""]
    if result.effort_lag_scan:
        scan = result.effort_lag_scan
        lag_ms = result.effort_lag_s * 1e3
        lines.append(f"- the efforts lag the joint-state stamps by {lag_ms:.2f} "
                     f"ms: the least regression residual over {len(scan['lags_s'])} lags "
                     f"({1e3 * scan['lags_s'][0]:.1f}-{1e3 * scan['lags_s'][-1]:.1f} ms; "
                     f"residual {min(scan['residual_rms_nm']):.3g} N·m there, "
                     f"{scan['residual_rms_nm'][0]:.3g} N·m at 0 ms); efforts moved onto the "
                     "stamps by it")
    else:
        lines.append(f"- effort lag behind the stamps: {result.effort_lag_s * 1e3:.2f} ms (given)")
    offsets = {k: v for k, v in result.regression_nuisance.items()
               if k.startswith("joint_offset_rad")}
    com = [result.regression_nuisance.get(f"payload_com_m[{a}]") for a in "xyz"]
    if offsets:
        lines.append("- estimated alongside, encoder offsets (measured - true, where gravity "
                     "makes them matter): " + ", ".join(
                         f"{result.joint_names[int(k.split('[')[1][:-1])]} {1e3 * v:+.1f} mrad"
                         for k, v in offsets.items()))
    if all(c is not None for c in com):
        lines.append("- payload centre of mass in the tool frame (the simulator's "
                     f"payload_offset_m): {np.round(np.array(com, dtype=float), 4).tolist()} m")
    lines += ["", "## Parameters", "",
              "| parameter | fitted | ±1σ fit | run-to-run σ |", "|---|---|---|---|"]
    for name, v in result.fitted.items():
        sp = result.spread.get(name)
        lines.append(f"| {name} | {v:.4g} | {result.std.get(name, float('nan')):.2g} | "
                     f"{'' if sp is None else f'{sp:.2g}'} |")
    lines += ["", f"![parameter confidence]({f3.name})", ""]
    if result.identifiability.refused:
        lines += ["## Refused (not identifiable from these runs)", ""]
        for name, why in result.identifiability.refused.items():
            lines.append(f"- `{name}`: {why}; kept at its base value")
        lines.append("")
    if result.noise is not None:
        nz = result.noise
        lines += ["## Sensor noise at rest", "",
                  f"- joint position std [rad]: {np.array2string(nz.joint_position_std_rad, precision=2)}",
                  f"- joint velocity std [rad/s]: {np.array2string(nz.joint_velocity_std_rad_s, precision=2)}"]
        if nz.ft_force_std_n is not None:
            lines.append(f"- F/T force std [N]: {nz.ft_force_std_n:.3g}")
        lines.append("")
    if residual is not None:
        lines += ["## Residual model (held out)", "",
                  f"One control period ahead ({residual.n_test} held-out samples): position RMS "
                  f"{residual.rms_q_sim_rad:.3g} rad without, {residual.rms_q_corrected_rad:.3g} "
                  f"rad with the residual ({residual.q_ratio:.2f}x); velocity RMS "
                  f"{residual.rms_qd_sim_rad_s:.3g} -> {residual.rms_qd_corrected_rad_s:.3g} rad/s.",
                  ""]
    lines += ["## Fit", "",
              f"{result.n_windows} windows, {result.iterations} solver evaluations, "
              f"{result.evaluations} simulations, cost {result.cost_initial:.4g} -> "
              f"{result.cost_final:.4g}, {result.duration_s:.1f} s.", ""]
    md = out / "report.md"
    md.write_text("\n".join(lines))
    return md
