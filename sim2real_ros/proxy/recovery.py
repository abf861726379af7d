"""Parameter recovery: what system identification found on the proxy vs the unit's hidden truth.

Read only after the fit is sealed. Only parameters whose meaning is the same in the simulator
and in the proxy are compared (a MuJoCo PID drive's gains are not a PyBullet PD's gains); the
others are listed as not comparable with the reason.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from sim2real_ros.config import load_yaml
from sim2real_ros.paths import default_urdf
from sim2real_ros.proxy.runfolder import RunFolder
from sim2real_ros.proxy.unit import ProxyUnit
from sim2real_ros.robot.model import load_arm

TOLERANCE = 0.10  # the target: within ±10 %


def truth_values(unit: ProxyUnit) -> dict[str, Any]:
    """The unit's values under the simulator's parameter names (comparable ones only)."""
    return {
        "mass_scale": unit.link_mass_scale,
        "payload_kg": unit.payload_kg,
        "joint_damping_nms": unit.joint_damping_nms,
        "joint_friction_nm": unit.joint_friction_nm,
        "armature_kgm2": unit.armature_kgm2,
        # The bus delays a command by latency + U(0, jitter): its mean is the unit's part of
        # what a fit sees (the fit's figure also holds the DDS hop and the drive's cycle).
        "action_latency_s": unit.action_latency_s + 0.5 * unit.action_jitter_s,
        "torque_limit_scale": unit.torque_limit_nm / load_arm(default_urdf()).max_effort_nm,
        "encoder_bias_rad": unit.encoder_bias_rad,
        "ft_bias": unit.ft_bias,
    }


NOT_COMPARABLE = {
    "kp_scale": "the proxy's drive is a PID tuned on the nominal arm; the simulator's is a PD "
    "scheduled on M(q): their gains have no common scale",
    "kd_scale": "as kp_scale",
    "inertia_scale": "the proxy models rotor inertia as armature, compared there",
}


def _flatten_fit(cal: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """Return the fitted values (the calibration's `nominal` plus its action latency) and the
    parameters the identifiability check refused, with why (sysid calibration format)."""
    fit = dict(cal.get("nominal") or {})
    latency = cal.get("latency") or {}
    if isinstance(latency, dict) and latency.get("action_latency_s") is not None:
        fit["action_latency_s"] = latency["action_latency_s"]
    refused = {str(k): str(v) for k, v in (cal.get("refused") or {}).items()}
    return fit, refused


def parameter_recovery(run: RunFolder, cfg: Any) -> dict[str, Any]:
    """Compare the sealed fit with the hidden unit; rows per parameter (and joint)."""
    if not run.is_sealed("s3b_sysid_fit"):
        return {"parameters": [], "note": "the system-identification fit (s3b) is not sealed"}
    cal_path = run.artifact("s3b_sysid_fit", "calibration.yaml")
    fit, refused = _flatten_fit(load_yaml(cal_path))
    arm = load_arm(default_urdf())
    unit = ProxyUnit.from_yaml(cfg.unit_path(), arm)
    truth = truth_values(unit)
    rows: list[dict[str, Any]] = []
    for key, true in truth.items():
        if key not in fit or fit[key] is None:
            why = next((f"refused: {v}" for k, v in refused.items() if k.startswith(key)),
                       "not fitted")
            rows.append({"parameter": key, "joint": "", "fitted": None,
                         "true": _plain(true), "rel_error": None, "within_10pct": None,
                         "note": why})
            continue
        fitted = np.atleast_1d(np.asarray(fit[key], dtype=float))
        t = np.atleast_1d(np.asarray(true, dtype=float))
        if fitted.shape != t.shape:
            if fitted.size == 1:
                fitted = np.full(t.shape, float(fitted[0]))
            else:
                rows.append({"parameter": key, "joint": "", "fitted": fitted.tolist(),
                             "true": t.tolist(), "rel_error": None, "within_10pct": None,
                             "note": f"shape {fitted.shape} vs {t.shape}"})
                continue
        names = arm.joint_names if t.size == arm.n_joints else [""] * t.size
        for j, (f, tv) in enumerate(zip(fitted, t, strict=True)):
            joint = names[j] if t.size > 1 else ""
            why = refused.get(f"{key}[{j}]") or refused.get(key)
            if why is not None:
                # The fit kept its prior for this one: nothing was recovered to compare.
                rows.append({"parameter": key, "joint": joint, "fitted": None,
                             "true": float(tv), "rel_error": None, "within_10pct": None,
                             "note": f"refused by the fit ({why.split(':')[0]}); kept at "
                                     f"{float(f):.4g}"})
                continue
            rel = (f - tv) / abs(tv) if abs(tv) > 1e-12 else (0.0 if abs(f) < 1e-12
                                                             else math.inf)
            rows.append({"parameter": key, "joint": joint,
                         "fitted": float(f), "true": float(tv),
                         "rel_error": None if math.isinf(rel) else float(rel),
                         "within_10pct": bool(abs(rel) <= TOLERANCE),
                         "note": "" if abs(tv) > 1e-12 else "true value is zero"})
    for key, why in NOT_COMPARABLE.items():
        if key in fit:
            rows.append({"parameter": key, "joint": "", "fitted": _plain(fit[key]),
                         "true": None, "rel_error": None, "within_10pct": None,
                         "note": f"not comparable: {why}"})
    compared = [r for r in rows if r["within_10pct"] is not None]
    return {
        "calibration": str(cal_path),
        "unit_file": str(cfg.unit_path()),
        "parameters": rows,
        "n_compared": len(compared),
        "n_within_10pct": sum(1 for r in compared if r["within_10pct"]),
    }


def _plain(v: Any) -> Any:
    return v.tolist() if isinstance(v, np.ndarray) else v


def recovery_markdown(rec: dict[str, Any]) -> str:
    """Render the recovery rows as a markdown table."""
    if not rec.get("parameters"):
        return f"Not available: {rec.get('note', 'no fit')}.\n"
    lines = ["| parameter | joint | fitted | proxy truth | error | within ±10 % |",
             "|---|---|---|---|---|---|"]
    for r in rec["parameters"]:
        def f(v: Any) -> str:
            return "—" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))
        err = "—" if r["rel_error"] is None else f"{100 * r['rel_error']:+.1f} %"
        ok = {True: "yes", False: "**no**", None: "—"}[r["within_10pct"]]
        note = f" ({r['note']})" if r.get("note") else ""
        lines.append(f"| {r['parameter']}{note} | {r['joint']} | {f(r['fitted'])} | "
                     f"{f(r['true'])} | {err} | {ok} |")
    lines.append(f"\n{rec['n_within_10pct']} of {rec['n_compared']} compared values within "
                 "±10 %.")
    return "\n".join(lines) + "\n"


def plot_recovery(rec: dict[str, Any], path: Path) -> Path:
    """Bar chart of relative errors per compared parameter with the ±10 % band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rec["parameters"] if r["rel_error"] is not None]
    fig, ax = plt.subplots(figsize=(8, max(2.5, 0.22 * len(rows) + 1)))
    y = np.arange(len(rows))
    errs = [100 * r["rel_error"] for r in rows]
    ax.barh(y, np.clip(errs, -100, 100),
            color=["tab:green" if r["within_10pct"] else "tab:red" for r in rows])
    ax.axvspan(-10, 10, color="grey", alpha=0.2)
    ax.set_yticks(y, [f"{r['parameter']} {r['joint']}".strip() for r in rows], fontsize=7)
    ax.set_xlabel("fit error vs proxy truth (%), clipped at ±100")
    fig.tight_layout()
    fig.savefig(path, dpi=90, bbox_inches="tight")  # long joint labels: never cut
    plt.close(fig)
    return path
