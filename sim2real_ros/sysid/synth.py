"""Synthetic "real" runs: the sim plant with hidden parameters, latency and sensor noise.

Ground truth for testing and benchmarking the fitter: what it recovers can be compared with what
was hidden. The runs can be written as bags in the recorder's layout, so the whole path
bag -> run -> fit -> calibration is exercised.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from sim2real_ros.sim.plant import ArmPlant, PlantParams
from sim2real_ros.sysid import bags
from sim2real_ros.sysid.excitation import Excitation
from sim2real_ros.sysid.runs import RunData
from sim2real_ros.sysid.shoot import simulate_segment, step_targets


@dataclass(frozen=True)
class SensorNoise:
    """Gaussian sensor noise (standard deviations) added to synthetic measurements."""

    q_std_rad: float = 5e-5
    qd_std_rad_s: float = 2e-3
    tau_std_nm: float = 0.05
    force_std_n: float = 0.2
    torque_std_nm: float = 0.01


def synthesize_run(
    plant: ArmPlant,
    params: PlantParams,
    excitation: Excitation,
    latency_s: float = 0.0,
    noise: SensorNoise = SensorNoise(),
    seed: int = 0,
    rest_s: float = 1.5,
    sample_hz: float = 500.0,
    command_hz: float = 100.0,
    transport_delay_s: float = 3e-4,
    name: str = "synthetic",
    metadata: dict[str, Any] | None = None,
) -> RunData:
    """Drive the plant with the excitation (rest before and after) and measure it noisily."""
    rng = np.random.default_rng(seed)
    plant.set_params(params)
    dt = plant.physics_dt_s
    total_s = excitation.duration_s + 2.0 * rest_s
    cmd_t = np.arange(0.0, total_s, 1.0 / command_hz)
    cmd = np.array([excitation.at(t - rest_s) for t in cmd_t])
    n_steps = int(round(total_s / dt))
    stride = int(round(1.0 / (sample_hz * dt)))
    sample_steps = np.arange(stride, n_steps + 1, stride)
    targets = step_targets(cmd_t, cmd, latency_s, 0.0, n_steps, dt, before=cmd[0])
    seg = simulate_segment(plant, cmd[0], np.zeros(plant.n), targets, sample_steps,
                           record_wrench=True)
    t = sample_steps * dt
    n = plant.n
    q = seg.q + rng.normal(0.0, noise.q_std_rad, (t.size, n))
    qd = seg.qd + rng.normal(0.0, noise.qd_std_rad_s, (t.size, n))
    tau = seg.tau + rng.normal(0.0, noise.tau_std_nm, (t.size, n))
    assert seg.wrench is not None
    w = seg.wrench.copy()
    w[:, :3] += rng.normal(0.0, noise.force_std_n, (t.size, 3))
    w[:, 3:] += rng.normal(0.0, noise.torque_std_nm, (t.size, 3))
    # Times from the first joint state, as load_run makes them.
    t0 = t[0]
    return RunData(
        name=name,
        joint_names=list(plant.joint_names),
        t_s=t - t0,
        q=q,
        qd=qd,
        tau=tau,
        cmd_t_s=cmd_t - t0,
        cmd=cmd,
        recv_t_s=t - t0 + transport_delay_s,
        wrench_t_s=t - t0,
        wrench=w,
        metadata=dict(metadata or {}),
        t0_abs_s=0.0,
    )


def write_run_bag(
    path: str | Path, run: RunData, metadata: dict[str, Any], t0_ns: int = 1_700_000_000 * 10**9
) -> Path:
    """Write a run as the recorder would: joint_states, commands as sent, F/T (absolute times)."""
    p = Path(path)
    names = run.joint_names
    events: list[tuple[int, int, str, Any]] = []
    recv = run.recv_t_s if run.recv_t_s is not None else run.t_s
    for k in range(run.t_s.size):
        stamp = t0_ns + int(round(run.t_s[k] * 1e9))
        msg = bags.joint_state_msg(names, stamp, run.q[k], run.qd[k],
                                   None if run.tau is None else run.tau[k])
        events.append((t0_ns + int(round(recv[k] * 1e9)), 0, "/joint_states", msg))
    for i in range(run.cmd_t_s.size):
        events.append((t0_ns + int(round(run.cmd_t_s[i] * 1e9)), 1,
                       "/forward_position_controller/commands", bags.multiarray_msg(run.cmd[i])))
    if run.wrench is not None and run.wrench_t_s is not None:
        for k in range(run.wrench_t_s.size):
            stamp = t0_ns + int(round(run.wrench_t_s[k] * 1e9))
            events.append((stamp, 2, "/force_torque_sensor_broadcaster/wrench",
                           bags.wrench_msg(stamp, "ft_sensor_link", run.wrench[k])))
    events.sort(key=lambda e: (e[0], e[1]))
    with bags.BagWriter(p, metadata) as bag:
        bag.add_topic("/joint_states", "sensor_msgs/msg/JointState", bags.make_qos())
        bag.add_topic("/forward_position_controller/commands", "std_msgs/msg/Float64MultiArray",
                      bags.make_qos())
        if run.wrench is not None:
            bag.add_topic("/force_torque_sensor_broadcaster/wrench",
                          "geometry_msgs/msg/WrenchStamped", bags.make_qos())
        for t_ns, _, topic, msg in events:
            bag.write_msg(topic, t_ns, msg)
    return p


def synthetic_metadata(serial: str, run_index: int, excitation: Excitation) -> dict[str, Any]:
    """Return bag metadata for a synthetic run (unit identity + how it was made)."""
    return bags.unit_metadata(
        serial,
        cell="synthetic",
        tool="none",
        date=datetime.now(timezone.utc).date().isoformat(),
        operator_note=f"synthetic run {run_index} from the sim plant with hidden parameters",
        envelope_sha256="",
        run_id=f"run{run_index}",
        excitation=excitation.describe(),
    )


def default_hidden_unit() -> tuple[PlantParams, float]:
    """Return the hidden parameters and action latency (s) of the synthetic reference unit.

    Far enough from the nominal plant that calibration matters (damping x0.4-2.4, Coulomb
    friction where the nominal has none, gains ±15 %, 8 % heavier, a 0.5 kg tool, 12 ms).
    """
    return (
        PlantParams(
            mass_scale=1.08,
            payload_kg=0.5,
            joint_damping_nms=np.array([0.8, 1.2, 0.6, 0.3, 0.25, 0.2]),
            joint_friction_nm=np.array([1.5, 2.0, 1.0, 0.3, 0.3, 0.2]),
            kp_scale=np.array([0.9, 1.1, 0.95, 1.05, 0.85, 1.0]),
        ),
        0.012,
    )


def run_variation(params: PlantParams, run_index: int, seed: int = 0,
                  rel_std: float = 0.02) -> PlantParams:
    """Return params with the small run-to-run changes a real unit shows (warm-up, grease)."""
    rng = np.random.default_rng([seed, run_index])
    p = params.copy()
    for name in ("joint_damping_nms", "joint_friction_nm"):
        v = getattr(p, name)
        if v is not None:
            setattr(p, name, np.asarray(v) * (1.0 + rel_std * rng.standard_normal(np.size(v))))
    return p
