"""SimCore: the plant plus every randomized model, driven by time. No rclpy.

What the sim bridge node, policy trainers and system-identification fitters drive:
`command()` sends a command through the action link (delay, jitter, drops) to the drive
(deadband, backlash, then the plant's servo with its gains, lag and torque limit); `advance()`
steps physics and redraws interval terms; `observe()` reads the sensors through the observation
link (delay, jitter, drops) and the sensor models (noise, bias, drift, quantization).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sim2real_ros.sim.actuator import ActuatorModel
from sim2real_ros.sim.camera import CameraConfig, render
from sim2real_ros.sim.latency import DelayLine
from sim2real_ros.sim.plant import CONTROL_MODES, ArmPlant, PlantParams
from sim2real_ros.sim.randomization import Draw, Nominal, RandomizationSpec, sample
from sim2real_ros.sim.sensors import SensorModel

HISTORY_MARGIN_S = 0.05
NORMAL_BLOCK = 4096  # standard normals the C sensor path gets at a time (~130 observations)
UNIFORM_BLOCK = 1024


@dataclass(slots=True)
class Observation:
    """What the controller receives: measured values and when they were measured."""

    t_s: float  # sim time at which the observation is read
    stamp_s: float  # sim time at which the measurement was taken (t_s minus observation delay)
    q: np.ndarray
    qd: np.ndarray
    tau_nm: np.ndarray
    wrench: np.ndarray  # (6,) [fx fy fz tx ty tz], sensor frame
    valid: bool = True  # False when the measurement was lost (values repeat the last valid one)


@dataclass
class CoreStats:
    """Counters over the life of a SimCore."""

    commands_sent: int = 0
    commands_dropped: int = 0
    commands_delivered: int = 0
    observations: int = 0
    observations_dropped: int = 0
    interval_redraws: int = 0
    resets: int = 0
    physics_steps: int = 0
    extra: dict[str, int] = field(default_factory=dict)


class SimCore:
    """The randomized simulated arm: one seed gives one draw and one trajectory, exactly."""

    def __init__(
        self,
        spec: RandomizationSpec | None = None,
        seed: int = 0,
        urdf_path: str | Path | None = None,
        physics_dt_s: float = 1e-3,
        calibration: PlantParams | None = None,
        q0: np.ndarray | None = None,
        camera: CameraConfig | None = None,
        floor: bool = False,
        native: bool | None = None,
    ) -> None:
        self.spec = spec or RandomizationSpec.disabled()
        self.plant = ArmPlant(
            urdf_path, physics_dt_s, calibration, ground_plane=floor, native=native
        )
        self.arm = self.plant.arm
        self.joint_names = list(self.plant.joint_names)
        self.n = self.plant.n
        self.spec.validate(self.arm)
        self.nominal = Nominal.for_arm(self.arm, calibration)
        self.home_q = (
            np.zeros(self.n) if q0 is None else np.asarray(q0, dtype=float).reshape(self.n)
        )
        self.camera = camera or CameraConfig()
        self.stats = CoreStats()
        self.seed = int(seed)
        self.episode = 0
        self._startup_draw = sample(
            self.spec, np.random.default_rng([self.seed, 0]), "startup", self.arm, self.nominal,
            seed=self.seed, episode=0,
        )
        self.draw: Draw = self._startup_draw
        self.reset()

    # ------------------------------------------------------------------ lifecycle
    @property
    def time_s(self) -> float:
        """Simulated time since the last reset, s."""
        return self.plant.time_s

    @property
    def physics_dt_s(self) -> float:
        """The physics step, s."""
        return self.plant.physics_dt_s

    def reset(self, seed: int | None = None, q0: np.ndarray | None = None) -> Observation:
        """Start a new episode with a new draw (reset and interval terms); return an observation.

        The draw of episode k with seed s uses the generator seeded by (s, k), so a seed and the
        number of resets reproduce it; startup terms keep the value drawn at construction.
        """
        if seed is not None:
            self.seed = int(seed)
        self.episode += 1
        self.stats.resets += 1
        self._draw_rng = np.random.default_rng([self.seed, self.episode])
        # Three noise streams: the action link (and camera), then the observation path's
        # normals (jitter, encoder drift and noise, F/T noise) and uniforms (drops). Each is
        # consumed in a fixed order, so the C sensor path can take them in blocks and still
        # see exactly the numbers the Python path draws one call at a time.
        self._noise_rng = np.random.default_rng([self.seed, self.episode, 1])
        self._sense_normal = np.random.default_rng([self.seed, self.episode, 2])
        self._sense_uniform = np.random.default_rng([self.seed, self.episode, 3])
        draw = sample(
            self.spec, self._draw_rng, "reset", self.arm, self.nominal,
            base=self._startup_draw, seed=self.seed, episode=self.episode,
        )
        q = self.home_q if q0 is None else np.asarray(q0, dtype=float)
        self._apply_draw(draw)
        self.plant.reset(q)
        self._native = self.plant._servo  # the C sensor path; None runs the Python one
        if self._native is not None:
            self._native.reset_sense()
            self._sync_native_models()
            self._nblock = np.empty(0)
            self._ublock = np.empty(0)
        self._actuator = ActuatorModel(draw.actuator, self.plant.state().q)
        self._mode = "position"
        self._last_obs: Observation | None = None
        self._last_stamp_s = 0.0
        self._next_interval = {
            t.name: self._interval_after(0.0, t.interval_s)  # type: ignore[arg-type]
            for t in self.spec.interval_terms()
        }
        self._update_next_event()
        return self.observe()

    def _sync_native_models(self) -> None:
        """Give the C sensor path the draw's sensor and observation-link parameters."""
        p = self.draw.sensor
        lat = self.draw.latency
        self._native.set_sensor(
            p.position_bias_rad.tolist(), p.position_drift_rad_per_sqrt_s.tolist(),
            np.concatenate([p.position_noise_rad, p.velocity_noise_rad_s,
                            p.effort_noise_nm]).tolist(),
            p.position_quantization_rad.tolist(), p.velocity_quantization_rad_s.tolist(),
            np.concatenate([p.ft_force_bias_n, p.ft_torque_bias_nm]).tolist(),
            np.concatenate([p.ft_force_noise_n, p.ft_torque_noise_nm]).tolist(),
        )
        self._native.set_latency(float(lat.observation_delay_s),
                                 float(lat.observation_jitter_s),
                                 float(lat.observation_drop_prob))

    def _refill(self) -> None:
        """Top up the C sensor path's random numbers, keeping the unused ones first."""
        nat = self._native
        nl, ul = nat.normals_left, nat.uniforms_left
        self._nblock = np.concatenate([
            self._nblock[len(self._nblock) - nl:], self._sense_normal.standard_normal(NORMAL_BLOCK)
        ])
        self._ublock = np.concatenate([
            self._ublock[len(self._ublock) - ul:], self._sense_uniform.random(UNIFORM_BLOCK)
        ])
        nat.set_normals(self._nblock)
        nat.set_uniforms(self._ublock)

    def _update_next_event(self) -> None:
        """When the next command arrives or the next interval term is redrawn, s."""
        self._next_event_s = min(
            self._action_link.next_release_s(),
            min(self._next_interval.values(), default=math.inf),
        )

    def _interval_after(self, t_s: float, interval: tuple[float, float]) -> float:
        return t_s + float(self._draw_rng.uniform(interval[0], interval[1]))

    def _apply_draw(self, draw: Draw) -> None:
        """Make every model run with the draw's parameters."""
        self.draw = draw
        self.plant.set_params(draw.plant)
        lat = draw.latency
        obs_window = lat.observation_delay_s + 6.0 * lat.observation_jitter_s
        if obs_window > 0:
            self.plant.enable_history(obs_window + HISTORY_MARGIN_S)
        self._action_link = DelayLine(
            lat.action_delay_s, lat.action_jitter_s, lat.action_drop_prob, self._noise_rng
        )
        self._sensor = SensorModel(draw.sensor, self._sense_normal)

    def _apply_interval(self, draw: Draw) -> None:
        """Update the models for a redraw in the middle of an episode (no state is lost)."""
        self.draw = draw
        self.plant.set_params(draw.plant)
        self._actuator.params = draw.actuator
        lat = draw.latency
        line = self._action_link
        line.delay_s, line.jitter_s, line.drop_prob = (
            lat.action_delay_s, lat.action_jitter_s, lat.action_drop_prob,
        )
        obs_window = lat.observation_delay_s + 6.0 * lat.observation_jitter_s
        if obs_window > 0 and obs_window + HISTORY_MARGIN_S > self.plant.history_s:
            self.plant.enable_history(obs_window + HISTORY_MARGIN_S)
        drift = self._sensor.drift_rad
        self._sensor.params = draw.sensor
        self._sensor.drift_rad = drift
        if self._native is not None:
            self._sync_native_models()

    # ------------------------------------------------------------------ commands
    def command(self, mode: str, values: np.ndarray) -> bool:
        """Send a command through the action link; return False if the link lost it."""
        if mode not in CONTROL_MODES:
            raise ValueError(f"mode = {mode!r}: expected one of {list(CONTROL_MODES)}")
        arr = np.asarray(values, dtype=float)
        if arr.shape != (self.n,):
            raise ValueError(f"{mode} command: expected {self.n} values, got shape {arr.shape}")
        if not np.isfinite(arr).all():
            raise ValueError(f"{mode} command has non-finite values: {arr.tolist()}")
        self.stats.commands_sent += 1
        if not self._action_link.push(self.time_s, (mode, arr.copy())):
            self.stats.commands_dropped += 1
            return False
        self._deliver_due()
        self._update_next_event()
        return True

    def _deliver_due(self) -> None:
        for mode, values in self._action_link.pop_due(self.time_s):
            self.stats.commands_delivered += 1
            if mode == "position":
                if self._mode != "position":
                    self._actuator.reset(self.plant.state().q)
                target = self._actuator.position_target(values)
            else:
                target = values
            self._mode = mode
            self.plant.hold(mode, target)  # checked in command()

    # ------------------------------------------------------------------ time
    def advance(self, duration_s: float) -> Observation:
        """Step physics for duration_s (whole physics steps), deliver commands, redraw terms."""
        plant = self.plant
        dt = plant.physics_dt_s
        k = int(round(duration_s / dt))
        target_steps = plant.steps + k
        if k > 0 and self._next_event_s > target_steps * dt + 1e-12:
            # Nothing arrives or is redrawn before the end: one stretch of physics (what the
            # loop below would do in its first pass, without its bookkeeping).
            plant.advance_steps(k)
            self.stats.physics_steps += k
            return self.observe()
        while plant.steps < target_steps:
            now = plant.time_s
            next_event = self._next_event_s
            remaining = target_steps - plant.steps
            if next_event <= now + 1e-12:
                k = 0
            elif next_event < math.inf:
                k = min(remaining, max(1, math.ceil((next_event - now) / dt - 1e-9)))
            else:
                k = remaining
            if k > 0:
                plant.advance_steps(k)
                self.stats.physics_steps += k
            if self._next_event_s <= plant.time_s + 1e-12:
                # Something is due (nothing is, otherwise, and both calls would do nothing).
                self._deliver_due()
                self._redraw_due()
                self._update_next_event()
        return self.observe()

    def _redraw_due(self) -> None:
        now = self.time_s
        due = [n for n, t in self._next_interval.items() if t <= now + 1e-12]
        if not due:
            return
        draw = sample(
            self.spec, self._draw_rng, "interval", self.arm, self.nominal, base=self.draw,
            only=due, seed=self.seed, episode=self.episode,
        )
        self._apply_interval(draw)
        self.stats.interval_redraws += len(due)
        for name in due:
            interval = self.spec.terms[name].interval_s
            self._next_interval[name] = self._interval_after(
                now, interval  # type: ignore[arg-type]
            )

    # ------------------------------------------------------------------ sensing
    def observe(self) -> Observation:
        """Read the sensors now: a measurement taken `observation delay` ago, with its errors."""
        plant = self.plant
        now = plant._t_s
        self.stats.observations += 1
        nat = self._native
        if nat is not None:
            # The C path (sim/_servo.c sense): the same steps as below, the same numbers.
            n = self.n
            buf = np.empty(3 * n + 7)
            r = nat.sense(buf, plant._steps)
            if r < 0:
                self._refill()
                r = nat.sense(buf, plant._steps)
            if r > 0:
                n2 = 2 * n + 1  # the C path keeps its own last stamp
                obs = Observation(now, float(buf[0]), buf[1:n + 1], buf[n + 1:n2], buf[n2:n2 + n],
                                  buf[n2 + n:], True)
                self._last_obs = obs
                return obs
            return self._repeat_last(now)
        lat = self.draw.latency
        if lat.observation_drop_prob > 0 and self._last_obs is not None:
            if float(self._sense_uniform.random()) < lat.observation_drop_prob:
                return self._repeat_last(now)
        delay = lat.observation_delay_s
        if lat.observation_jitter_s > 0:
            delay += abs(lat.observation_jitter_s * float(self._sense_normal.standard_normal()))
        if delay > 0:
            # Measurements arrive in order: a stamp never goes back.
            stamp = min(max(now - delay, self._last_stamp_s, 0.0), now)
            state = self.plant.history_at(stamp)
        else:
            state = self.plant.state()
        self._last_stamp_s = state.t_s
        q, qd, tau = self._sensor.joints(state.t_s, state.q, state.qd, state.tau_nm)
        obs = Observation(now, state.t_s, q, qd, tau, self._sensor.wrench(state.wrench), True)
        self._last_obs = obs
        return obs

    def _repeat_last(self, now: float) -> Observation:
        """A lost measurement: the last valid values again, marked invalid."""
        self.stats.observations_dropped += 1
        last = self._last_obs
        assert last is not None  # a drop needs a previous measurement
        return Observation(
            now, last.stamp_s, last.q.copy(), last.qd.copy(), last.tau_nm.copy(),
            last.wrench.copy(), valid=False,
        )

    def render(self) -> np.ndarray:
        """Return an (H, W, 3) uint8 camera image with the draw's appearance."""
        return render(
            self.plant.client, self.plant.body, self.plant.floor, self.draw.visual,
            self._noise_rng, self.camera,
        )

    def close(self) -> None:
        """Release the physics client."""
        self.plant.close()
