"""Calibration files: the fitted unit as data the sim bridge loads (`calibration_file:=`).

Layout (YAML):

    unit: {serial, cell, tool, date, operator_note, envelope_sha256}
    created_utc: ISO time
    runs: [bag names]            n_runs: int
    nominal: {PlantParams field: value}      # what the simulator runs with
    confidence: {field: std}                 # 1-sigma from the fit (null = not fitted)
    spread: {field: run-to-run std}          # null where fewer than two runs
    refused: {parameter: why}                # identifiability pre-check
    latency: {action_latency_s, action_latency_std_s, observation_latency_s, response_lag_s,
              action_latency_source, dead_time_probe (when the runs carry a latency probe)}
    noise: {joint_position_std_rad: [...], joint_velocity_std_rad_s: [...], ...}  # at rest
    fit: {train_runs, validation_runs, rollout_rms_nominal_rad, rollout_rms_calibrated_rad, ...}
    randomization: {terms: {...}}            # config/randomization.yaml format

The randomization ranges come from the run-to-run spread (±2 std) with a floor, so a policy
trained on the calibrated simulator still sees the variation the unit showed between runs.
Files are written to a temporary name and renamed, and an existing calibration is only replaced
with `force=True`: nothing already written is lost to an error.
"""

from __future__ import annotations

import math
import os
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from sim2real_ros.config import ConfigError, load_yaml
from sim2real_ros.sim.plant import PlantParams
from sim2real_ros.sysid.fit import LATENCY, FitResult
from sim2real_ros.sysid.runs import NoiseProfile

# Randomization floors (relative for scale terms, absolute otherwise): a unit that happened to
# repeat perfectly over three runs must still not be simulated as one exact plant.
SCALE_FLOOR = {"link_mass": 0.02, "link_inertia": 0.05, "joint_damping": 0.1,
               "joint_friction": 0.1, "kp": 0.03, "armature": 0.1, "kd": 0.05}
SCALE_CAP = 0.5
PAYLOAD_FLOOR_KG = 0.05
ACTION_DELAY_FLOOR_S = 0.002
OBSERVATION_DELAY_FLOOR_S = 0.001
NOISE_BAND = (0.8, 1.25)  # measured noise std x this band
SPREAD_SIGMAS = 2.0
# fitted PlantParams field -> randomization term (scale against the calibrated nominal)
SCALE_TERMS = {
    "mass_scale": "link_mass",
    "inertia_scale": "link_inertia",
    "joint_damping_nms": "joint_damping",
    "joint_friction_nm": "joint_friction",
    "kp_scale": "kp",
    "kd_scale": "kd",
    "armature_kgm2": "armature",
}
REQUIRED_KEYS = ("unit", "created_utc", "runs", "n_runs", "nominal", "latency", "noise",
                 "randomization")


class CalibrationError(ConfigError):
    """A calibration file is missing, malformed, or would overwrite one without --force."""


@dataclass
class Calibration:
    """A loaded calibration file."""

    path: str
    unit_id: str
    unit: dict[str, Any]
    created_utc: str
    runs: list[str]
    n_runs: int
    nominal: dict[str, Any]
    confidence: dict[str, Any]
    spread: dict[str, Any]
    latency: dict[str, Any]
    noise: dict[str, Any]
    randomization: dict[str, Any]
    refused: dict[str, str] = field(default_factory=dict)
    fit: dict[str, Any] = field(default_factory=dict)

    def plant_params(self) -> PlantParams:
        """Return the nominal section as PlantParams."""
        return PlantParams.from_dict(self.nominal, self.path)

    @property
    def action_latency_s(self) -> float:
        """Return the identified action latency, s."""
        return float(self.latency.get("action_latency_s", 0.0))


def _plain(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        return [_plain(x) for x in v.tolist()]
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (np.floating, float)):
        f = float(v)
        return f if math.isfinite(f) else None
    if isinstance(v, (np.integer,)):
        return int(v)
    return v


def _group_values(result: FitResult, per_param: dict[str, float]) -> dict[str, Any]:
    """Fold 'group[i]' entries back into per-joint lists (None where not fitted)."""
    n = len(result.joint_names)
    out: dict[str, Any] = {}
    for d in result.defs:
        if d.group == LATENCY:
            continue
        if d.index is None:
            out[d.group] = per_param.get(d.name)
        else:
            out.setdefault(d.group, [None] * n)[d.index] = per_param.get(d.name)
    return out


def nominal_section(result: FitResult) -> dict[str, Any]:
    """Return every PlantParams field of the fitted groups (fitted or base value)."""
    p = result.params
    out: dict[str, Any] = {}
    for d in result.defs:
        if d.group == LATENCY or d.group in out:
            continue
        out[d.group] = _plain(getattr(p, d.group))
    # fields the sim needs to reproduce the fitted plant even if they were not fitted
    for name in ("servo_bandwidth_hz", "servo_damping_ratio", "payload_offset_m"):
        out.setdefault(name, _plain(getattr(p, name)))
    return out


def _rel_spread(values: Any, spreads: Any) -> float | None:
    v = np.atleast_1d(np.asarray(values, dtype=float))
    s = np.atleast_1d(np.asarray([np.nan if x is None else x for x in np.atleast_1d(spreads)],
                                 dtype=float))
    ok = np.isfinite(s) & (np.abs(v) > 1e-9)
    if not ok.any():
        return None
    return float(np.max(SPREAD_SIGMAS * s[ok] / np.abs(v[ok])))


def randomization_section(
    nominal: dict[str, Any],
    spread: dict[str, Any],
    latency: dict[str, Any],
    noise: NoiseProfile | None,
) -> dict[str, Any]:
    """Return a randomization spec ({terms: ...}) centred on the calibration."""
    terms: dict[str, Any] = {}
    for fld, term in SCALE_TERMS.items():
        if fld not in nominal:
            continue
        rel = _rel_spread(nominal[fld], spread.get(fld)) if spread.get(fld) is not None else None
        r = min(max(rel if rel is not None else 0.0, SCALE_FLOOR[term]), SCALE_CAP)
        terms[term] = {"operation": "scale", "distribution": "uniform",
                       "range": [round(1.0 - r, 6), round(1.0 + r, 6)], "mode": "reset"}
    if "payload_kg" in nominal:
        p = float(nominal["payload_kg"])
        s = spread.get("payload_kg")
        r = max(SPREAD_SIGMAS * float(s) if s is not None else 0.0, PAYLOAD_FLOOR_KG)
        terms["payload_mass"] = {"operation": "abs", "distribution": "uniform",
                                 "range": [round(max(p - r, 0.0), 6), round(p + r, 6)],
                                 "mode": "reset"}
    lat = float(latency.get("action_latency_s") or 0.0)
    lat_sp = latency.get("action_latency_spread_s")
    r = max(SPREAD_SIGMAS * float(lat_sp) if lat_sp is not None else 0.0, ACTION_DELAY_FLOOR_S)
    terms["action_delay"] = {"operation": "abs", "distribution": "uniform",
                             "range": [round(max(lat - r, 0.0), 6), round(lat + r, 6)],
                             "mode": "reset"}
    obs = latency.get("observation_latency_s")
    if obs is not None:
        o = max(float(obs), 0.0)
        terms["observation_delay"] = {
            "operation": "abs", "distribution": "uniform",
            "range": [round(max(o - OBSERVATION_DELAY_FLOOR_S, 0.0), 6),
                      round(o + OBSERVATION_DELAY_FLOOR_S, 6)],
            "mode": "reset"}
    if noise is not None:
        lo, hi = NOISE_BAND
        bands = {
            "joint_position_noise": noise.joint_position_std_rad,
            "joint_velocity_noise": noise.joint_velocity_std_rad_s,
            "joint_effort_noise": noise.joint_effort_std_nm,
            "ft_force_noise": None if noise.ft_force_std_n is None else [noise.ft_force_std_n],
            "ft_torque_noise": None if noise.ft_torque_std_nm is None else [
                noise.ft_torque_std_nm],
        }
        for term, values in bands.items():
            if values is None:
                continue
            v = np.asarray(values, dtype=float)
            terms[term] = {"operation": "abs", "distribution": "uniform",
                           "range": [float(f"{lo * v.min():.6g}"), float(f"{hi * v.max():.6g}")],
                           "mode": "reset"}
    return {"terms": terms}


def calibration_dict(
    result: FitResult, unit: dict[str, Any], runs: list[str], created_utc: str | None = None
) -> dict[str, Any]:
    """Build the calibration file's content from a fit."""
    nominal = nominal_section(result)
    confidence = _group_values(result, result.std)
    spread = _group_values(result, result.spread) if result.spread else {}
    lat_spread = result.spread.get(LATENCY)
    latency = {
        "action_latency_s": float(result.action_latency_s),
        "action_latency_std_s": result.std.get(LATENCY),
        "action_latency_spread_s": lat_spread,
        "action_latency_xcorr_s": float(result.latency.action_latency_s),
        "response_lag_s": float(result.latency.response_lag_s),
        "observation_latency_s": result.observation_latency_s,
        # "probe": the dead time read at the latency probe's moves from rest, held in the fit;
        # "fit": fitted with the drive (the dead time as the simulator's drive sees it).
        "action_latency_source": result.latency_source,
    }
    if result.dead_time is not None:
        latency["dead_time_probe"] = {k: v for k, v in result.dead_time.items()
                                      if k in ("dead_time_s", "spread_s", "stderr_s",
                                               "n_onsets", "per_run_s")}
    noise = result.noise.to_dict() if result.noise is not None else {}
    fit_info = {
        "train_runs": result.train_runs,
        "validation_runs": result.validation_runs,
        "in_sample_validation": result.in_sample_validation,
        "rollout_horizon_note": "open-loop rollouts from measured states on the validation runs",
        "rollout_rms_nominal_rad": result.error_nominal.rms_q_total_rad,
        "rollout_rms_calibrated_rad": result.error_calibrated.rms_q_total_rad,
        "improvement": result.improvement,
        "cost_initial": result.cost_initial,
        "cost_final": result.cost_final,
        "iterations": result.iterations,
        "simulations": result.evaluations,
        "windows": result.n_windows,
        "duration_s": result.duration_s,
        # How the efforts were read (sysid/regression.py): their lag behind the stamps, and
        # what the effort regression estimated alongside the physics.
        "effort_lag_s": result.effort_lag_s,
        "regression_nuisance": dict(result.regression_nuisance),
    }
    return _plain({
        "unit": unit,
        "created_utc": created_utc or datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "runs": list(runs),
        "n_runs": len(runs),
        "nominal": nominal,
        "confidence": confidence,
        "spread": spread,
        "refused": dict(result.identifiability.refused),
        "latency": latency,
        "noise": noise,
        "fit": fit_info,
        "randomization": randomization_section(nominal, spread, latency, result.noise),
    })


def write_calibration(data: dict[str, Any], path: str | Path, force: bool = False) -> Path:
    """Write atomically (temp file + rename); refuse to replace a file unless force."""
    p = Path(path)
    if p.exists() and not force:
        raise CalibrationError(p, "<file>", "exists",
                               "a new path, or --force to replace the existing calibration")
    p.parent.mkdir(parents=True, exist_ok=True)
    header = (f"# Calibration of unit {data.get('unit', {}).get('serial', '?')} written by "
              f"`sim2real sysid fit` ({data.get('created_utc', '')}). Format: docs/sysid.md.\n")
    text = header + yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=99)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        # a file that does not load back must never replace a good one
        load_calibration(tmp)
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return p


def load_calibration(path: str | Path) -> Calibration:
    """Read and check a calibration file; CalibrationError names the file and key."""
    p = Path(path)
    try:
        data = load_yaml(p)
    except ConfigError as exc:
        raise CalibrationError(exc.path, exc.key, exc.value, exc.allowed) from None
    for key in REQUIRED_KEYS:
        if key not in data:
            raise CalibrationError(p, key, None, "present (see docs/sysid.md for the format)")
    unit = data["unit"]
    if not isinstance(unit, dict) or not str(unit.get("serial", "")).strip():
        raise CalibrationError(p, "unit.serial", unit, "the serial of the calibrated unit")
    for key in ("nominal", "latency", "noise", "randomization"):
        if not isinstance(data[key], dict):
            raise CalibrationError(p, key, data[key], "a mapping")
    try:
        PlantParams.from_dict(data["nominal"], p)
    except ConfigError as exc:
        raise CalibrationError(p, f"nominal.{exc.key}", exc.value, exc.allowed) from None
    n_runs = data["n_runs"]
    if isinstance(n_runs, bool) or not isinstance(n_runs, int) or n_runs < 1:
        raise CalibrationError(p, "n_runs", n_runs, "an integer >= 1")
    if not isinstance(data["runs"], list) or len(data["runs"]) != n_runs:
        raise CalibrationError(p, "runs", data["runs"], f"a list of {n_runs} run names")
    return Calibration(
        path=str(p),
        unit_id=str(unit["serial"]),
        unit=dict(unit),
        created_utc=str(data["created_utc"]),
        runs=[str(r) for r in data["runs"]],
        n_runs=int(n_runs),
        nominal=dict(data["nominal"]),
        confidence=dict(data.get("confidence") or {}),
        spread=dict(data.get("spread") or {}),
        latency=dict(data["latency"]),
        noise=dict(data["noise"]),
        randomization=dict(data["randomization"]),
        refused=dict(data.get("refused") or {}),
        fit=dict(data.get("fit") or {}),
    )


def check_unit(calibration: Calibration, live_unit_id: str) -> str | None:
    """Return a loud warning if the live arm is not the calibrated unit, else None."""
    live = (live_unit_id or "").strip()
    if live == calibration.unit_id:
        return None
    shown = live or "<unknown>"
    return (f"UNIT MISMATCH: calibration {calibration.path} was made on unit "
            f"'{calibration.unit_id}' but the live arm reports '{shown}'. The simulator and "
            "every limit derived from it describe a different arm; recalibrate this unit "
            "(sim2real sysid excite / fit) before trusting sim results.")
