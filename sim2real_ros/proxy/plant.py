"""The proxy arm: the same URDF in MuJoCo, driven like a real position-mode drive, with a unit's
hidden perturbations.

It is a stand-in for the physical arm (hardware-in-the-loop style): a second physics engine whose
integrator (implicit-in-velocity), contact solver (soft convex constraints) and dry-friction model
(frictionloss constraints) differ from PyBullet's by construction, plus the unit's actual masses,
payload, friction, backlash, bus latency, drive torque limits, encoder and F/T errors. No rclpy
here: the node converts messages and keeps this core in step with the wall clock.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import mujoco
import numpy as np

from sim2real_ros.paths import default_urdf
from sim2real_ros.proxy.unit import ProxyUnit
from sim2real_ros.robot.model import ArmModel, load_arm

FT_LINK = "ft_sensor_link"
TIP_LINK = "tool0"
_INTEGRATORS = {
    "implicitfast": mujoco.mjtIntegrator.mjINT_IMPLICITFAST,
    "implicit": mujoco.mjtIntegrator.mjINT_IMPLICIT,
    "rk4": mujoco.mjtIntegrator.mjINT_RK4,
    "euler": mujoco.mjtIntegrator.mjINT_EULER,
}
# MuJoCo's URDF importer fuses bodies joined by fixed joints and drops visuals unless told not
# to; the F/T sensor needs ft_sensor_link to stay its own body (its subtree is what it weighs).
_TUNING_POSES = 256
_MUJOCO_COMPILER = '<mujoco><compiler fusestatic="false" discardvisual="true"/></mujoco>'


@dataclass
class ProxyMeasurement:
    """What the drive and the F/T sensor report: encoder and sensor errors included."""

    t_s: float
    q: np.ndarray
    qd: np.ndarray
    tau_nm: np.ndarray
    wrench: np.ndarray  # (6,) [fx, fy, fz, tx, ty, tz] in the ft_sensor_link frame


@dataclass
class ProxyTruth:
    """The proxy's true state (what a laser tracker would see); never published on a topic."""

    t_s: float
    q: np.ndarray
    qd: np.ndarray
    tau_nm: np.ndarray
    wrench: np.ndarray
    servo_target: np.ndarray  # the position the drive is servoing to (after latency, backlash)


def urdf_to_mjspec(urdf_path: str | Path) -> mujoco.MjSpec:
    """Load a URDF into an MjSpec with fixed-joint bodies kept separate."""
    text = Path(urdf_path).read_text()
    start = text.find("<robot")
    close = text.find(">", start)
    if start < 0 or close < 0:
        raise ValueError(f"{urdf_path}: no <robot> element")
    # A <mujoco> extension element is how MuJoCo's URDF reader takes compiler options.
    text = text[: close + 1] + _MUJOCO_COMPILER + text[close + 1 :]
    return mujoco.MjSpec.from_string(text)


class ProxyPlant:
    """One proxy unit simulated in MuJoCo with a PID position servo per joint."""

    def __init__(
        self, unit: ProxyUnit | None = None, urdf_path: str | Path | None = None
    ) -> None:
        self.urdf_path = Path(urdf_path) if urdf_path is not None else default_urdf()
        self.arm: ArmModel = load_arm(self.urdf_path)
        self.unit = unit if unit is not None else ProxyUnit.nominal(self.arm)
        if list(self.unit.joint_names) != self.arm.joint_names:
            raise ValueError(
                f"unit {self.unit.unit_id} is for joints {list(self.unit.joint_names)}, "
                f"the URDF has {self.arm.joint_names}"
            )
        self.joint_names = list(self.arm.joint_names)
        self.n = self.arm.n_joints
        self.physics_dt_s = self.unit.physics_dt_s
        self.lower_rad = self.arm.lower_rad
        self.upper_rad = self.arm.upper_rad
        # The drive is tuned on the nominal arm, as a vendor tunes it: the unit's extra mass and
        # payload then show up as tracking and holding-torque differences, as on a real arm.
        self.kp, self.kd, self.ki = self._servo_gains()
        # MuJoCo's implicit integrators apply the drive's velocity term at the step's end
        # velocity: the torque that moves the joint is actuator_force - dt·kv·q̈ (q̈ the step's
        # realized acceleration). actuator_force alone over-reports by dt·kv·q̈, an apparent
        # rotor inertia of dt·kv (0.1-0.7 kg·m² on the shipped unit's big joints), which the
        # effort regression read as armature. The drives report the applied torque.
        implicit = self.unit.integrator in ("implicitfast", "implicit")
        self._implicit_kv = self.kd.copy() if implicit else np.zeros(self.n)
        self._dt_kv = self.physics_dt_s * self._implicit_kv
        self._qacc = np.zeros(self.n)
        # The reported effort is the mean applied torque over the steps since the last
        # measurement (see measure()): its running sum and step count.
        self._tau_sum = np.zeros(self.n)
        self._tau_steps = 0
        self.model = self._build_model(self.unit, with_drives=True)
        self.data = mujoco.MjData(self.model)
        self._qadr = np.array(
            [self.model.jnt_qposadr[self.model.joint(j).id] for j in self.joint_names]
        )
        self._dadr = np.array(
            [self.model.jnt_dofadr[self.model.joint(j).id] for j in self.joint_names]
        )
        self._force_adr = self.model.sensor_adr[self.model.sensor("ft_force").id]
        self._torque_adr = self.model.sensor_adr[self.model.sensor("ft_torque").id]
        self._rng = np.random.default_rng(self.unit.seed)
        self._queue: deque[tuple[float, np.ndarray]] = deque()
        self._last_apply_s = 0.0
        self._command = np.zeros(self.n)
        self._target = np.zeros(self.n)
        self.steps = 0
        self.reset()

    # ---- model construction -------------------------------------------------------------
    def _spec(self, with_drives: bool) -> mujoco.MjSpec:
        spec = urdf_to_mjspec(self.urdf_path)
        spec.option.timestep = self.unit.physics_dt_s
        spec.option.integrator = _INTEGRATORS[self.unit.integrator]
        # The cell's table top: the arm's base stands on it (MuJoCo never collides two bodies
        # welded to the world), the moving links can hit it.
        spec.worldbody.add_geom(
            name="table", type=mujoco.mjtGeom.mjGEOM_PLANE, size=[2.0, 2.0, 0.05]
        )
        ft = spec.body(FT_LINK)
        if ft is None:
            raise ValueError(f"{self.urdf_path}: no link {FT_LINK} for the wrist F/T sensor")
        ft.add_site(name="ft_site")
        spec.add_sensor(
            name="ft_force", type=mujoco.mjtSensor.mjSENS_FORCE,
            objtype=mujoco.mjtObj.mjOBJ_SITE, objname="ft_site",
        )
        spec.add_sensor(
            name="ft_torque", type=mujoco.mjtSensor.mjSENS_TORQUE,
            objtype=mujoco.mjtObj.mjOBJ_SITE, objname="ft_site",
        )
        for i, j in enumerate(self.joint_names if with_drives else []):
            act = spec.add_actuator(
                name=f"{j}_drive", target=j, trntype=mujoco.mjtTrn.mjTRN_JOINT
            )
            # MuJoCo's own PID actuator: its velocity term is integrated implicitly (implicitfast),
            # its integral state is anti-windup clamped, its output saturates at the drive's limit.
            limit = float(self.unit.torque_limit_nm[i])
            ki = float(self.ki[i])
            act.set_to_pid(
                kp=float(self.kp[i]),
                kv=float(self.kd[i]),
                ki=ki if ki > 0 else -1,
                imax=limit / ki if ki > 0 else -1,
                # Drives in position mode ramp to a new setpoint at no more than rated speed.
                slewmax=float(self.arm.max_velocity_rad_s[i]),
                ctrlspec=int(mujoco.mjtCtrlInput.mjINPUT_POS),
            )
            act.forcelimited = True
            act.forcerange = [-limit, limit]
        return spec

    def _build_model(self, unit: ProxyUnit, with_drives: bool) -> mujoco.MjModel:
        spec = self._spec(with_drives)
        for i, j in enumerate(self.joint_names):
            js = spec.joint(j)
            # MuJoCo 4 takes a polynomial damping [linear, quadratic, cubic]; only the linear term.
            js.damping = [float(unit.joint_damping_nms[i]), 0.0, 0.0]
            js.frictionloss = float(unit.joint_friction_nm[i])
            js.armature = float(unit.armature_kgm2[i])
        if unit.link_mass_scale != 1.0:
            for body in spec.bodies:
                if body.name == "world" or body.mass <= 0:
                    continue
                body.mass = body.mass * unit.link_mass_scale
                body.inertia = np.asarray(body.inertia) * unit.link_mass_scale
        if unit.payload_kg > 0:
            tool = spec.body(TIP_LINK)
            if tool is None:
                raise ValueError(f"{self.urdf_path}: no link {TIP_LINK} to mount the payload on")
            # A compact payload (a 5 cm sphere's inertia) bolted to the tool flange.
            r = 0.05
            i_kgm2 = 0.4 * unit.payload_kg * r * r
            tool.add_body(
                name="payload", pos=unit.payload_offset_m.tolist(), mass=unit.payload_kg,
                inertia=[i_kgm2, i_kgm2, i_kgm2], explicitinertial=True,
            )
        return spec.compile()

    def _servo_gains(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Tune each drive for the largest inertia it sees over the workspace (nominal masses).

        Tuned for the worst case, the loop stays at least critically damped everywhere; at
        lighter poses it is stiffer, as a fixed-gain industrial drive is.
        """
        nominal = ProxyUnit.nominal(self.arm)
        model = self._build_model(
            ProxyUnit(**{**nominal.__dict__, "armature_kgm2": self.unit.armature_kgm2}),
            with_drives=False,
        )
        data = mujoco.MjData(model)
        qadr = [model.jnt_qposadr[model.joint(j).id] for j in self.joint_names]
        dadr = [model.jnt_dofadr[model.joint(j).id] for j in self.joint_names]
        rng = np.random.default_rng(0)  # a fixed pose set: the tuning is part of the drive
        poses = [self.unit.servo_reference_pose_rad] + [
            rng.uniform(self.lower_rad, self.upper_rad) for _ in range(_TUNING_POSES)
        ]
        full = np.zeros((model.nv, model.nv))
        inertia = np.zeros(self.n)
        for q in poses:
            data.qpos[qadr] = q
            mujoco.mj_forward(model, data)
            mujoco.mj_fullM(model, data, full)
            inertia = np.maximum(inertia, np.diag(full)[dadr])
        wn = 2.0 * math.pi * self.unit.servo_bandwidth_hz
        # A light joint behind a viscous gearbox would be over-damped by the gearbox alone; an
        # autotuner raises the gains until the drive's own damping at least matches it.
        urdf_damping = np.array([self.arm.all_joints[j].damping for j in self.joint_names])
        inertia = np.maximum(inertia, urdf_damping / (2.0 * self.unit.servo_damping_ratio * wn))
        kp = inertia * wn * wn
        kd = 2.0 * self.unit.servo_damping_ratio * wn * inertia
        ti = self.unit.servo_integral_time_s
        ki = kp / ti if ti > 0 else np.zeros(self.n)
        return kp, kd, ki

    # ---- simulation ---------------------------------------------------------------------
    @property
    def time_s(self) -> float:
        """Plant time since the last reset, s."""
        return float(self.data.time)

    def reset(self, q0: np.ndarray | None = None) -> ProxyMeasurement:
        """Put the arm at rest at q0 (default zero), holding q0; clear queued commands."""
        q = np.zeros(self.n) if q0 is None else np.asarray(q0, dtype=float)
        if q.shape != (self.n,):
            raise ValueError(f"expected {self.n} joint positions, got shape {q.shape}")
        mujoco.mj_resetData(self.model, self.data)
        self.data.qpos[self._qadr] = q
        mujoco.mj_forward(self.model, self.data)
        self._queue.clear()
        self._qacc = np.zeros(self.n)
        self._tau_sum = np.zeros(self.n)
        self._tau_steps = 0
        self._last_apply_s = 0.0
        self._command = q.copy()
        self._target = q.copy()
        self.data.ctrl[:] = q
        # The drive's activation states are [slewed setpoint, integral]: start at rest on q.
        for i in range(self.n):
            adr, num = self.model.actuator_actadr[i], self.model.actuator_actnum[i]
            if num >= 1:
                self.data.act[adr] = q[i]
            if num >= 2:
                self.data.act[adr + 1] = 0.0
        mujoco.mj_forward(self.model, self.data)
        self.steps = 0
        return self.measure()

    def command_position(
        self, q_target_rad: np.ndarray, issued_at_s: float | None = None
    ) -> float:
        """Queue a position command; return the plant time at which the drive will act on it.

        The bus delays it by the unit's latency plus a uniform jitter; commands never overtake
        one another (a fieldbus delivers in order).
        """
        q = np.asarray(q_target_rad, dtype=float)
        if q.shape != (self.n,) or not np.all(np.isfinite(q)):
            raise ValueError(f"expected {self.n} finite joint positions, got {q!r}")
        t = self.time_s if issued_at_s is None else float(issued_at_s)
        delay = self.unit.action_latency_s
        if self.unit.action_jitter_s > 0:
            delay += float(self._rng.uniform(0.0, self.unit.action_jitter_s))
        apply_s = max(t + delay, self._last_apply_s)
        self._last_apply_s = apply_s
        self._queue.append((apply_s, np.clip(q, self.lower_rad, self.upper_rad)))
        return apply_s

    def _apply_due_commands(self) -> None:
        t = self.time_s + 0.5 * self.physics_dt_s
        changed = False
        while self._queue and self._queue[0][0] <= t:
            self._command = self._queue.popleft()[1]
            changed = True
        if changed:
            # Gearbox backlash: the output follows only once the play on either side is taken up.
            half = 0.5 * self.unit.backlash_rad
            self._target = np.clip(self._target, self._command - half, self._command + half)
            self.data.ctrl[:] = self._target

    def step(self, n: int = 1) -> None:
        """Advance n physics steps; the drives act on each command when the bus delivers it."""
        left = int(n)
        model, data, dadr = self.model, self.data, self._dadr
        inv_dt = 1.0 / self.physics_dt_s
        while left > 0:
            self._apply_due_commands()
            chunk = left
            if self._queue:
                due = int(math.ceil((self._queue[0][0] - self.time_s) / self.physics_dt_s - 0.5))
                chunk = min(left, max(due, 1))
            # One step at a time: the reported effort averages every step's applied torque.
            for _ in range(chunk):
                v0 = data.qvel[dadr]
                mujoco.mj_step(model, data, 1)
                self._qacc = (data.qvel[dadr] - v0) * inv_dt
                self._tau_sum += self.applied_torque()
            self._tau_steps += chunk
            self.steps += chunk
            left -= chunk

    def advance(self, duration_s: float) -> ProxyMeasurement:
        """Advance by a duration (rounded to whole physics steps) and return a measurement."""
        self.step(int(round(duration_s / self.physics_dt_s)))
        return self.measure()

    def advance_to(self, t_s: float) -> int:
        """Advance until plant time reaches t_s; return the number of steps taken."""
        n = int(math.floor((t_s - self.time_s) / self.physics_dt_s + 1e-9))
        if n > 0:
            self.step(n)
        return max(n, 0)

    def _true_wrench(self) -> np.ndarray:
        # MuJoCo reports the force the parent (wrist_3) exerts on ft_sensor_link's subtree in
        # the site frame. A wrist F/T sensor reports what the tool side loads it with: the
        # opposite sign (a hanging tool reads its weight along gravity).
        f = self.data.sensordata[self._force_adr : self._force_adr + 3]
        tq = self.data.sensordata[self._torque_adr : self._torque_adr + 3]
        return -np.concatenate([f, tq])

    def applied_torque(self) -> np.ndarray:
        """The drives' torque over the last physics step, N·m (what their current sensing reads).

        actuator_force less the implicit velocity term dt·kv·q̈ (see __init__); a drive at its
        force limit applies the limit.
        """
        force = self.data.actuator_force
        limit = self.unit.torque_limit_nm
        free = np.abs(force) < limit * (1.0 - 1e-9)
        corrected = force - self._dt_kv * self._qacc
        return np.where(free, np.clip(corrected, -limit, limit), force)

    def truth(self) -> ProxyTruth:
        """Return the true state (tests and post-run reports only; never on a topic)."""
        return ProxyTruth(
            self.time_s,
            self.data.qpos[self._qadr].copy(),
            self.data.qvel[self._dadr].copy(),
            self.applied_torque(),
            self._true_wrench(),
            self._target.copy(),
        )

    def measure(self) -> ProxyMeasurement:
        """Return what the encoders, drives and F/T sensor report now.

        Positions and velocities are sampled now; the effort is the mean applied torque over
        the physics steps since the previous measurement (the last step's torque when none
        ran), as a drive's current measurement integrates over its reporting period. A
        snapshot of one 1 ms step of a PID fed a 100 Hz staircase carries its ripple at a
        phase that changes from sample to sample; at 125 Hz that ripple swamped the damping
        and armature of the big joints in the effort regression (docs/proxy.md).
        """
        u = self.unit
        q = self.data.qpos[self._qadr] + u.encoder_bias_rad + u.encoder_drift_rad_s * self.time_s
        if np.any(u.encoder_noise_std_rad > 0):
            q = q + self._rng.normal(0.0, 1.0, self.n) * u.encoder_noise_std_rad
        res = u.encoder_resolution_rad
        q = np.where(res > 0, np.round(q / np.where(res > 0, res, 1.0)) * res, q)
        wrench = self._true_wrench() + u.ft_bias
        if np.any(u.ft_noise_std > 0):
            wrench = wrench + self._rng.normal(0.0, 1.0, 6) * u.ft_noise_std
        if self._tau_steps:
            tau = self._tau_sum / self._tau_steps
        else:
            tau = self.applied_torque()
        self._tau_sum = np.zeros(self.n)
        self._tau_steps = 0
        return ProxyMeasurement(self.time_s, q, self.data.qvel[self._dadr].copy(), tau, wrench)

    def pending_commands(self) -> int:
        """Number of commands still on the bus (sent, not yet acted on)."""
        return len(self._queue)
