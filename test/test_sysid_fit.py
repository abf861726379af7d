"""Fitting: ground-truth recovery on synthetic runs, latency, identifiability, calibration file,
report and residual model (one fit shared by the module to stay within the time budget)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sim2real_ros.sim.plant import ArmPlant, PlantParams
from sim2real_ros.sysid import calibration as cal
from sim2real_ros.sysid import excitation as ex
from sim2real_ros.sysid import synth
from sim2real_ros.sysid.fit import (
    LATENCY,
    FitError,
    FitOptions,
    check_identifiability,
    estimate_latency,
    fit,
    get_value,
)
from sim2real_ros.sysid.runs import RunError, check_same_unit

HIDDEN_LATENCY_S = 0.012
CONTROL_PERIOD_S = 0.01


@pytest.fixture(scope="module")
def plant() -> Any:
    p = ArmPlant()
    yield p
    p.close()


@pytest.fixture(scope="module")
def hidden() -> PlantParams:
    return synth.default_hidden_unit()[0]


def _runs(plant: ArmPlant, params: PlantParams, n: int, duration_s: float,
          latency_s: float = HIDDEN_LATENCY_S, amplitude: float = 0.4) -> list[Any]:
    env = ex.ExcitationEnvelope.from_arm(plant.arm, velocity_fraction=0.4,
                                         max_acceleration_rad_s2=6.0)
    out = []
    for i in range(n):
        exc = ex.make_excitation("multisine", ex.default_center(env), env, duration_s,
                                 amplitude, seed=i)
        out.append(synth.synthesize_run(plant, params, exc, latency_s=latency_s, seed=10 + i,
                                        rest_s=1.0, name=f"run{i}",
                                        metadata=synth.synthetic_metadata("SN-T", i, exc)))
    return out


@pytest.fixture(scope="module")
def fitted(plant: ArmPlant, hidden: PlantParams) -> Any:
    runs = _runs(plant, hidden, 2, 6.0)
    opts = FitOptions(window_every_s=0.75, max_iterations=6, progress=False,
                      precheck_window_stride=2, spread=False)
    return fit(runs, opts, plant=plant), runs


# The issue's ±10 % for damping too. It needs the fit to compare each shooting window only after
# it has settled (FitOptions.settle_s): with the plant's stiff drive (kd ~ 700 N·m·s/rad on the
# shoulder) the start-state error of a window is a torque transient correlated with the motion,
# which biased shoulder-pan damping by +35 % when windows were compared from their first sample
# (see docs/sysid.md, "Known limits").
DAMPING_TOLERANCE = 0.10


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_fit_recovers_hidden_parameters_within_tolerance(fitted: Any, plant: ArmPlant,
                                                         hidden: PlantParams) -> None:
    result, _ = fitted
    truth = plant.resolved_params(hidden)
    assert not result.identifiability.refused
    tol = {"joint_damping_nms": DAMPING_TOLERANCE, "joint_friction_nm": 0.10,
           "kp_scale": 0.10, "mass_scale": 0.05, "payload_kg": 0.10}
    for d in result.defs:
        if d.group in tol:
            want = get_value(truth, HIDDEN_LATENCY_S, d)
            got = result.fitted[d.name]
            assert abs(got - want) <= tol[d.group] * abs(want), (d.name, got, want)
    assert abs(result.action_latency_s - HIDDEN_LATENCY_S) < CONTROL_PERIOD_S
    assert result.improvement >= 3.0
    assert result.validation_runs == ["run1"] and result.train_runs == ["run0"]


def test_latency_cross_correlation_finds_the_delay_within_a_control_period(
        plant: ArmPlant) -> None:
    runs = _runs(plant, PlantParams(), 1, 3.0, latency_s=0.025)
    est = estimate_latency(plant, runs, plant.resolved_params(PlantParams()), 0.1)
    assert abs(est.action_latency_s - 0.025) < CONTROL_PERIOD_S / 2
    # the raw command-to-response lag also holds the servo's lag
    assert est.response_lag_s > est.action_latency_s


def test_identifiability_refuses_and_names_an_unexcited_parameter() -> None:
    rng = np.random.default_rng(0)
    jac = rng.normal(size=(400, 4))
    jac[:, 2] = 0.0  # a joint that never moved
    jac[:, 3] = jac[:, 0] + 1e-6 * rng.normal(size=400)  # indistinguishable from another
    out = check_identifiability(jac, ["a", "b", "damping[2]", "d"], max_rel_std=0.1,
                                max_vif=1e4)
    assert "damping[2]" in out.refused and "zero sensitivity" in out.refused["damping[2]"]
    assert ("a" in out.refused) != ("d" in out.refused)  # one of the collinear pair goes
    assert "b" in out.kept


def test_runs_of_different_units_are_refused(plant: ArmPlant, fitted: Any) -> None:
    _, runs = fitted
    other = runs[1]
    other.metadata = {**other.metadata, "unit": {**other.metadata["unit"], "serial": "SN-X"}}
    try:
        with pytest.raises(RunError, match="different units"):
            check_same_unit(runs)
    finally:
        other.metadata["unit"]["serial"] = "SN-T"


def test_calibration_file_round_trips_and_the_sim_loads_it(fitted: Any, tmp_path: Path,
                                                           plant: ArmPlant) -> None:
    from sim2real_ros.sim.randomization import load_calibration as sim_load

    result, runs = fitted
    data = cal.calibration_dict(result, runs[0].metadata["unit"], [r.name for r in runs])
    path = cal.write_calibration(data, tmp_path / "SN-T.yaml")
    c = cal.load_calibration(path)
    assert (c.unit_id, c.n_runs, c.runs) == ("SN-T", 2, ["run0", "run1"])
    np.testing.assert_allclose(c.nominal["kp_scale"], result.params.kp_scale)
    assert abs(c.latency["action_latency_s"] - result.action_latency_s) < 1e-12
    assert len(c.noise["joint_position_std_rad"]) == 6
    nominal, spec = sim_load(path, plant.arm)  # the sim bridge's own loader accepts it
    assert spec is not None and "action_delay" in spec.terms and "kp" in spec.terms
    lo, hi = spec.terms["action_delay"].range
    assert lo <= result.action_latency_s <= hi
    assert np.allclose(nominal.joint_friction_nm, result.params.joint_friction_nm)
    assert cal.check_unit(c, "SN-T") is None
    warning = cal.check_unit(c, "SN-OTHER")
    assert warning is not None and "SN-OTHER" in warning and "SN-T" in warning


def test_calibration_is_never_overwritten_by_accident(fitted: Any, tmp_path: Path) -> None:
    result, runs = fitted
    data = cal.calibration_dict(result, runs[0].metadata["unit"], [r.name for r in runs])
    path = cal.write_calibration(data, tmp_path / "SN-T.yaml")
    before = path.read_bytes()
    with pytest.raises(cal.CalibrationError, match="--force"):
        cal.write_calibration(data, path)
    broken = {**data, "nominal": {**data["nominal"], "warp_drive": 1.0}}
    with pytest.raises(cal.CalibrationError, match="warp_drive"):
        cal.write_calibration(broken, path, force=True)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["SN-T.yaml"]  # no temp file left


def test_report_has_plots_and_tables(fitted: Any, tmp_path: Path) -> None:
    from sim2real_ros.sysid.report import write_report

    result, runs = fitted
    md = write_report(result, tmp_path / "report", runs[0].metadata["unit"])
    text = md.read_text()
    for png in ("joint_fit.png", "rollout_error.png", "parameter_confidence.png"):
        assert (tmp_path / "report" / png).stat().st_size > 5000
        assert png in text
    assert "Held-out rollout error" in text and LATENCY in text


@pytest.mark.timeout(600)
def test_residual_model_learns_what_the_sim_misses(plant: ArmPlant, tmp_path: Path) -> None:
    from sim2real_ros.sysid.residual import ResidualModel, correct_next_state, train_residual

    # "real": a 2 kg tool and heavy joint losses the simulator does not know about
    real = PlantParams(payload_kg=2.0, joint_damping_nms=np.full(6, 3.0))
    runs = _runs(plant, real, 2, 3.0, latency_s=0.0, amplitude=0.3)
    model, rep = train_residual(plant, runs[:1], runs[1:], PlantParams(), 0.0, every_s=0.01,
                                epochs=400)
    assert rep.n_test > 200
    assert rep.rms_qd_corrected_rad_s < 0.8 * rep.rms_qd_sim_rad_s
    assert rep.rms_q_corrected_rad < rep.rms_q_sim_rad
    loaded = ResidualModel.load(model.save(tmp_path / "res.pt"))
    x = np.ones((3, 24))
    np.testing.assert_allclose(loaded.predict(x), model.predict(x), rtol=1e-6)
    q, qd = correct_next_state(loaded, np.zeros(6), np.zeros(6), np.ones(6), np.zeros(6),
                               np.zeros(6))
    assert q.shape == (6,) and qd.shape == (6,)


@pytest.mark.timeout(600)
def test_hold_regression_keeps_the_effort_regression_and_fits_only_the_drive(
        plant: ArmPlant, hidden: PlantParams) -> None:
    """--hold-regression: the physics comes from the inverse-dynamics regression on the drive
    torques and stays there; the simulation fit moves only kp and the latency. On this
    synthetic unit the regression recovers mass and payload (its friction is biased by the
    simulator's velocity-motor friction, which is why holding is an option, not the default),
    and every held value gets a run-to-run spread from one regression per run."""
    runs = _runs(plant, hidden, 2, 5.0)
    groups = ("joint_friction_nm", "mass_scale", "payload_kg", "kp_scale", LATENCY)
    hold = ("joint_friction_nm", "mass_scale", "payload_kg")
    lines: list[str] = []
    opts = FitOptions(groups=groups, hold_regression=hold, window_every_s=0.75,
                      max_iterations=4, progress=False, spread=True)
    result = fit(runs, opts, plant=plant, log=lines.append)
    assert any(line.startswith("held at the effort regression: ") for line in lines)
    start_line = next(line for line in lines if line.startswith("start (effort regression"))
    start = dict(item.split("=") for item in start_line.split(": ", 1)[1].split(", "))
    truth = plant.resolved_params(hidden)
    held = [d for d in result.defs if d.group in hold]
    assert len(held) == 8
    for d in held:
        got = result.fitted[d.name]
        # exactly the regression's start value, and the fitted plant carries it
        assert f"{got:.3g}" == start[d.name]
        assert got == pytest.approx(get_value(result.params, result.action_latency_s, d))
        assert d.name in result.spread and np.isfinite(result.spread[d.name])
    for name, tol in (("mass_scale", 0.05), ("payload_kg", 0.1)):
        d = next(d for d in held if d.name == name)
        want = get_value(truth, HIDDEN_LATENCY_S, d)
        assert abs(result.fitted[name] - want) <= tol * want, (name, result.fitted[name], want)
    assert abs(result.action_latency_s - HIDDEN_LATENCY_S) < CONTROL_PERIOD_S
    # Only what the regression estimates may be held (not the drive, not an unfitted group).
    for bad in (("kp_scale",), (LATENCY,), ("joint_damping_nms",)):
        with pytest.raises(FitError, match="hold_regression"):
            FitOptions(groups=groups, hold_regression=bad).check()
