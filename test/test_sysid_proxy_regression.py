"""The fit's effort regression on proxy recordings at the experiment's 125 Hz joint-state rate.

Three 20 s multisine runs on the MuJoCo proxy (the shipped hidden unit, encoder errors included)
recorded as the sysid recorder does (`proxy.offline.record_excitation`), then the fit's physics
path: the drive's start (`servo_start`) and the debiased effort regression (`effort_estimate`).
"""

from __future__ import annotations

import numpy as np
import pytest

from sim2real_ros.paths import share_path
from sim2real_ros.policy.task import TaskConfig
from sim2real_ros.proxy.offline import record_excitation
from sim2real_ros.proxy.plant import ProxyPlant
from sim2real_ros.proxy.recovery import truth_values
from sim2real_ros.proxy.unit import ProxyUnit
from sim2real_ros.sim.plant import ArmPlant
from sim2real_ros.sysid import excitation as ex
from sim2real_ros.sysid import fit as F

HOLD = ("joint_damping_nms", "joint_friction_nm", "armature_kgm2", "mass_scale",
        "inertia_scale", "payload_kg")
GROUPS = HOLD + ("kp_scale", "kd_scale", "action_latency_s")


@pytest.fixture(scope="module")
def recorded() -> tuple[ArmPlant, list, dict]:
    sim = ArmPlant()
    unit = ProxyUnit.from_yaml(share_path("config", "proxy", "unit_proxy-SN0001.yaml"), sim.arm)
    env = ex.ExcitationEnvelope.from_arm(sim.arm, 0.3, 0.3, 3.0)  # the recorder's defaults
    plant = ProxyPlant(unit)
    runs = [record_excitation(plant, ex.make_excitation(
        "multisine", np.array(TaskConfig().home_rad), env, 20.0, 0.3, 0.2, 2.0, seed=s),
        obs_rate_hz=125.0, name=f"seed{s}") for s in (1, 2, 3)]
    yield sim, runs, truth_values(unit)
    sim.close()


def _estimate(sim: ArmPlant, runs: list) -> dict[str, float]:
    base = sim.resolved_params()
    servo = F.servo_start(sim, runs, base, 0.02, 0.1)
    assert servo is not None
    drive = {f"kp_scale[{j}]": float(v) for j, v in enumerate(servo.kp_scale)}
    warm = F.effort_estimate(sim, runs, base, F.param_defs(GROUPS, sim.n), GROUPS,
                             servo.latency_s, 0.1, drive)
    return warm.values


def test_record_excitation_samples_at_the_asked_rates(recorded: tuple) -> None:
    _, runs, _ = recorded
    r = runs[0]
    assert r.sample_period_s == pytest.approx(1 / 125.0)
    assert np.median(np.diff(r.cmd_t_s)) == pytest.approx(0.01)
    assert r.t_s[-1] == pytest.approx(24.0, abs=0.01)  # 2 s hold, 20 s excitation, 2 s hold
    assert r.tau is not None and np.all(np.isfinite(r.tau))
    # The arm moved: the excitation reached the drive through the bus.
    assert np.ptp(r.q, axis=0).min() > 0.05


def test_regression_at_125_hz_recovers_the_big_joints_armature(recorded: tuple) -> None:
    sim, runs, truth = recorded
    est = _estimate(sim, runs)
    arm = np.array([est[f"armature_kgm2[{j}]"] for j in range(3)])
    rel = (arm - truth["armature_kgm2"][:3]) / truth["armature_kgm2"][:3]
    assert np.all(np.abs(rel) < 0.15), rel
    assert abs(est["mass_scale"] / truth["mass_scale"] - 1) < 0.05
    fric = np.array([est[f"joint_friction_nm[{j}]"] for j in range(6)])
    assert np.all(np.abs(fric / truth["joint_friction_nm"] - 1) < 0.15)


def test_the_former_40_ms_window_aliased_the_command_staircase(recorded: tuple,
                                                               monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    # 5 samples at 125 Hz pass the 100 Hz staircase's 25 Hz alias: armature was read at the bound.
    sim, runs, truth = recorded
    monkeypatch.setattr(F, "SAVGOL_MIN_S", 0.04)
    monkeypatch.setattr(F, "SAVGOL_MIN_SAMPLES", 5)
    est = _estimate(sim, runs)
    arm = np.array([est[f"armature_kgm2[{j}]"] for j in range(3)])
    assert np.max(np.abs(arm / truth["armature_kgm2"][:3] - 1)) > 0.5
