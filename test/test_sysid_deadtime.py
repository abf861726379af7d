"""The latency probe: moves from rest appended to an excitation, and the dead time read there.

The proxy cases record on the MuJoCo proxy (the shipped hidden unit: a PID drive, an 18 ms bus
with up to 6 ms of jitter, backlash, encoder errors, efforts as period means at 125 Hz) as the
sysid recorder does (`proxy.offline.record_excitation`); the simulator cases synthesize runs from
the PyBullet plant (a PD drive, a fixed latency, sensor noise, efforts sampled at the stamps).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from sim2real_ros.paths import share_path
from sim2real_ros.policy.task import TaskConfig
from sim2real_ros.proxy.offline import record_excitation
from sim2real_ros.proxy.plant import ProxyPlant
from sim2real_ros.proxy.recovery import truth_values
from sim2real_ros.proxy.unit import ProxyUnit
from sim2real_ros.sim.plant import ArmPlant, PlantParams
from sim2real_ros.sysid import excitation as ex
from sim2real_ros.sysid import synth
from sim2real_ros.sysid.calibration import calibration_dict
from sim2real_ros.sysid.deadtime import DeadTimeError, estimate_dead_time, find_onsets
from sim2real_ros.sysid.fit import LATENCY, FitError, FitOptions, fit
from sim2real_ros.sysid.regression import align_effort
from sim2real_ros.sysid.runs import RunData
from sim2real_ros.sysid.synth import SensorNoise, synthesize_run

PERIOD_S = 1 / 125.0


@pytest.fixture(scope="module")
def arm_env():
    sim = ArmPlant()
    env = ex.ExcitationEnvelope.from_arm(sim.arm, 0.3, 0.3, 3.0)  # the recorder's defaults
    yield sim, env
    sim.close()


def _probed(env: ex.ExcitationEnvelope, seed: int, duration_s: float = 8.0,
            moves: int = 12) -> ex.Excitation:
    base = ex.make_excitation("multisine", np.array(TaskConfig().home_rad), env, duration_s,
                              0.3, seed=seed)
    return ex.append_latency_probe(base, env, moves, 0.03, 40.0, 0.6, seed=seed)


def _proxy_runs(sim: ArmPlant, env: ex.ExcitationEnvelope, unit: ProxyUnit,
                seeds: tuple[int, ...]) -> list[RunData]:
    plant = ProxyPlant(unit)
    runs = [record_excitation(plant, _probed(env, s), obs_rate_hz=125.0, name=f"seed{s}")
            for s in seeds]
    # The proxy's drives report the mean torque of each period: half a period behind.
    return align_effort(runs, 0.5 * PERIOD_S)


# ---- the probe ------------------------------------------------------------------------------

def test_probe_appends_moves_from_rest_inside_the_envelope(arm_env) -> None:
    sim, env = arm_env
    base = ex.make_excitation("multisine", np.array(TaskConfig().home_rad), env, 8.0, 0.3,
                              seed=1)
    probed = ex.append_latency_probe(base, env, 12, 0.03, 40.0, 0.6, seed=1)
    move_s = ex.probe_move_s(0.03, 40.0)
    assert probed.duration_s == pytest.approx(base.duration_s + 0.6 + 12 * (move_s + 0.6),
                                              abs=2e-3)
    # the excitation itself is untouched, the probe returns to where it started
    np.testing.assert_array_equal(probed.q[:base.q.shape[0]], base.q)
    np.testing.assert_allclose(probed.q[-1], base.q[-1], atol=1e-12)
    tail = probed.q[base.q.shape[0]:] - base.q[-1]
    assert np.abs(tail).max() == pytest.approx(3 * 0.03, rel=1e-6)  # three moves out
    # the jerk peaks at the requested value (60·Δ/T³ at a move's ends)
    jerk = np.abs(np.diff(probed.qdd[base.q.shape[0]:], axis=0)).max() * ex.GRID_HZ
    assert 0.8 * 40.0 < jerk < 1.1 * 40.0
    info = probed.describe()["latency_probe"]
    assert info["moves"] == 12 and info["starts_at_s"] == pytest.approx(base.duration_s)
    assert len(info["directions"]) == sim.n


def test_probe_refuses_bad_settings_naming_them(arm_env) -> None:
    _, env = arm_env
    base = ex.make_excitation("multisine", np.array(TaskConfig().home_rad), env, 4.0, seed=0)
    with pytest.raises(ex.ExcitationError, match="multiple of 6"):
        ex.append_latency_probe(base, env, 8)
    with pytest.raises(ex.ExcitationError, match="hold_s"):
        ex.append_latency_probe(base, env, 6, hold_s=0.1)
    with pytest.raises(ex.ExcitationError, match="jerk_rad_s3"):
        ex.append_latency_probe(base, env, 6, jerk_rad_s3=float("nan"))
    # a move too fast for the envelope names the joint and the bound it leaves
    with pytest.raises(ex.ExcitationError, match="shoulder_pan_joint: .velocity"):
        ex.append_latency_probe(base, env, 6, step_rad=0.2, jerk_rad_s3=1000.0)


# ---- finding onsets -------------------------------------------------------------------------

def _run_from_commands(cmd: np.ndarray, rate_hz: float = 100.0) -> RunData:
    t = np.arange(cmd.shape[0]) / rate_hz
    n = cmd.shape[1]
    return RunData(name="cmds", joint_names=[f"j{k}" for k in range(n)], t_s=t, q=cmd.copy(),
                   qd=np.zeros_like(cmd), tau=np.zeros_like(cmd), cmd_t_s=t, cmd=cmd)


def test_onsets_are_moves_from_rest_that_continue_their_direction() -> None:
    # joint 0: up, up (counts), down (a reversal: backlash), down (counts), then a move after
    # too short a rest (does not count); joint 1 only moves with the second onset of joint 0.
    seq = [(1.0, 0, +1), (2.0, 0, +1), (3.0, 0, -1), (4.0, 0, -1), (4.45, 0, -1),
           (2.0, 1, -1), (3.0, 1, -1)]
    cmd = np.zeros((600, 2))
    for t0, j, sign in sorted(seq):
        k = int(round(t0 * 100))
        cmd[k:k + 20, j] += sign * np.linspace(0.0, 0.01, 21)[1:]
        cmd[k + 20:, j] += sign * 0.01
    onsets = find_onsets(_run_from_commands(cmd))
    by_time = {round(o.t_s, 2): o.joints for o in onsets}
    # 2.0: joint 0 continues up; joint 1's first move has no direction before it
    # 3.0: joint 0 reverses, joint 1 continues; 4.0: joint 0 continues down
    assert by_time == {2.0: (0,), 3.0: (1,), 4.0: (0,)}
    assert all(o.index == int(round(o.t_s * 100)) for o in onsets)


def test_a_move_that_ends_creeping_back_leaves_the_gearbox_the_other_way() -> None:
    # down, overshooting by 1 mrad and creeping back up; then down again: that start crosses
    # the backlash first (a filter that trimmed the reference did this on the graph)
    cmd = np.zeros((400, 1))
    down = -np.linspace(0.0, 0.011, 21)[1:]
    creep = -0.011 + np.linspace(0.0, 0.001, 11)[1:]
    cmd[100:120, 0] = down
    cmd[120:130, 0] = creep
    cmd[130:, 0] = -0.010
    cmd[200:220, 0] = -0.010 - np.linspace(0.0, 0.01, 21)[1:]
    cmd[220:, 0] = -0.020
    cmd[300:320, 0] = -0.020 - np.linspace(0.0, 0.01, 21)[1:]
    cmd[320:, 0] = -0.030
    onsets = find_onsets(_run_from_commands(cmd))
    # only the third move: the second follows a move that ended going up
    assert [round(o.t_s, 2) for o in onsets] == [3.0]


# ---- the dead time --------------------------------------------------------------------------

def test_dead_time_on_the_proxy_within_ten_percent_of_the_bus(arm_env) -> None:
    """The shipped unit: 18 ms + U(0, 6 ms) of bus delay under a PID drive with backlash.

    The simulation fit read this unit's latency as 29.6-33.5 ms (the PID's lag); the probe
    reads the bus.
    """
    sim, env = arm_env
    unit = ProxyUnit.from_yaml(share_path("config", "proxy", "unit_proxy-SN0001.yaml"), sim.arm)
    truth = truth_values(unit)["action_latency_s"]
    assert truth == pytest.approx(0.021)
    est = estimate_dead_time(_proxy_runs(sim, env, unit, (1, 2, 3)))
    assert est.n_onsets >= 24  # 8 clean starts per run (of 12 moves) on three runs
    assert abs(est.dead_time_s / truth - 1) < 0.10, est.to_dict()
    assert est.stderr_s < 0.0015
    assert set(est.per_run_s) == {"seed1", "seed2", "seed3"}


def test_dead_time_follows_the_bus_not_the_drive(arm_env) -> None:
    """A slower bus moves the estimate by the difference; the integral time does not."""
    sim, env = arm_env
    unit = ProxyUnit.from_yaml(share_path("config", "proxy", "unit_proxy-SN0001.yaml"), sim.arm)
    slow = replace(unit, action_latency_s=0.040)
    no_integral = replace(unit, servo_integral_time_s=0.0)
    d_slow = estimate_dead_time(_proxy_runs(sim, env, slow, (4, 5))).dead_time_s
    d_pd = estimate_dead_time(_proxy_runs(sim, env, no_integral, (4, 5))).dead_time_s
    assert abs(d_slow / 0.043 - 1) < 0.10
    assert abs(d_pd / 0.021 - 1) < 0.10


def test_dead_time_on_the_simulator_at_its_latency(arm_env) -> None:
    """The PyBullet plant's PD drive, 30 ms latency, sensor noise, efforts at 500 Hz."""
    sim, env = arm_env
    params = sim.resolved_params(PlantParams())
    runs = [synthesize_run(sim, params, _probed(env, s, 4.0, 6), 0.030, SensorNoise(), seed=s,
                           sample_hz=500.0, name=f"s{s}") for s in (1, 2)]
    est = estimate_dead_time(runs)
    # the synthetic transport adds 0.3 ms to the latency
    assert est.dead_time_s == pytest.approx(0.0303, abs=0.0015)
    assert set(est.per_run_s) == {"s1", "s2"}
    # A run cut after its first usable start has no median of its own (one start is no
    # run's dead time: it would set the randomization's delay range); it still counts.
    first = min(e.onset.t_s for e in est.onsets if e.onset.run == "s2")
    cut = replace(runs[1].slice_time(0.0, first + 0.3), name="s2_cut")
    both = estimate_dead_time([runs[0], cut])
    assert any(e.onset.run == "s2_cut" for e in both.onsets)
    assert set(both.per_run_s) == {"s1"}


def test_no_probe_no_estimate(arm_env) -> None:
    sim, env = arm_env
    params = sim.resolved_params(PlantParams())
    exc = ex.make_excitation("multisine", np.array(TaskConfig().home_rad), env, 4.0, seed=0)
    run = synthesize_run(sim, params, exc, 0.03, SensorNoise(), seed=0, sample_hz=500.0)
    with pytest.raises(DeadTimeError, match="--latency-probe"):
        estimate_dead_time([run])
    no_effort = replace(run, tau=None)
    with pytest.raises(DeadTimeError, match="efforts"):
        estimate_dead_time([no_effort])
    with pytest.raises(DeadTimeError, match="max_latency_s"):
        estimate_dead_time([run], max_latency_s=float("inf"))


# ---- in the fit -----------------------------------------------------------------------------

def _synth_probed(sim: ArmPlant, probe: bool) -> list[RunData]:
    hidden = synth.default_hidden_unit()[0]
    env = ex.ExcitationEnvelope.from_arm(sim.arm, velocity_fraction=0.4,
                                         max_acceleration_rad_s2=6.0)
    runs = []
    for i in range(2):
        exc = ex.make_excitation("multisine", ex.default_center(env), env, 5.0, 0.4, seed=i)
        if probe:
            exc = ex.append_latency_probe(exc, env, 6, seed=i)
        runs.append(synth.synthesize_run(sim, hidden, exc, latency_s=0.012, seed=10 + i,
                                         rest_s=1.0, name=f"run{i}",
                                         metadata=synth.synthetic_metadata("SN-T", i, exc)))
    return runs


def test_fit_holds_the_latency_at_the_probe(arm_env) -> None:
    """auto: the bags carry a probe, so its dead time is the latency, held; the calibration
    says where the latency came from; 'fit' fits it and still reports the probe."""
    sim, _ = arm_env
    runs = _synth_probed(sim, probe=True)
    groups = ("kp_scale", LATENCY)
    lines: list[str] = []
    opts = FitOptions(groups=groups, window_every_s=0.75, max_iterations=2, progress=False)
    held = fit(runs, opts, plant=sim, log=lines.append)
    assert held.latency_source == "probe"
    assert held.dead_time is not None and held.dead_time["n_onsets"] >= 4
    assert held.action_latency_s == held.dead_time["dead_time_s"] == held.fitted[LATENCY]
    assert held.action_latency_s == pytest.approx(0.0123, abs=0.0015)  # + 0.3 ms transport
    assert any(f"{LATENCY} held at the probe's dead time" in line for line in lines)
    assert held.spread[LATENCY] == pytest.approx(
        np.std(list(held.dead_time["per_run_s"].values()), ddof=1))
    cal = calibration_dict(held, {"serial": "SN-T"}, [r.name for r in runs])
    assert cal["latency"]["action_latency_source"] == "probe"
    assert cal["latency"]["dead_time_probe"]["dead_time_s"] == held.action_latency_s
    fitted = fit(runs, replace(opts, latency_source="fit"), plant=sim)
    assert fitted.latency_source == "fit" and fitted.dead_time is not None
    assert fitted.action_latency_s != held.action_latency_s


def test_fit_refuses_a_probe_the_runs_do_not_carry(arm_env) -> None:
    sim, _ = arm_env
    runs = _synth_probed(sim, probe=False)
    opts = FitOptions(groups=("kp_scale", LATENCY), window_every_s=0.75, max_iterations=1,
                      progress=False, spread=False, latency_source="probe")
    with pytest.raises(FitError, match="latency probe: .*--latency-probe"):
        fit(runs, opts, plant=sim)
    with pytest.raises(FitError, match="latency_source"):
        FitOptions(latency_source="echo").check()
