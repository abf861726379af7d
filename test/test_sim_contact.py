"""The contact terms on the floor: lateral, spinning and rolling friction and restitution each
measurably do what they say on a free object (a box or a ball) moving on the SimCore's floor."""

from __future__ import annotations

import numpy as np
import pybullet as pb

from sim2real_ros.paths import default_urdf
from sim2real_ros.robot.model import load_arm
from sim2real_ros.sim.core import SimCore
from sim2real_ros.sim.randomization import RandomizationSpec

ARM = load_arm(default_urdf())
G = 9.81


def fixed(value: float) -> dict:
    return {"operation": "abs", "distribution": "uniform", "range": [value, value],
            "mode": "reset"}


def floor_core(**terms: float) -> SimCore:
    spec = RandomizationSpec.from_dict(
        {"terms": {f"contact_{k}": fixed(v) for k, v in terms.items()}}, "test-spec", ARM)
    return SimCore(spec, seed=0, floor=True)


def spawn(core: SimCore, shape: str, pos: list[float], **dyn: float) -> int:
    c = core.plant.client
    if shape == "box":
        col = pb.createCollisionShape(pb.GEOM_BOX, halfExtents=[0.05] * 3, physicsClientId=c)
    else:
        col = pb.createCollisionShape(pb.GEOM_SPHERE, radius=0.05, physicsClientId=c)
    body = pb.createMultiBody(1.0, col, basePosition=pos, physicsClientId=c)
    # The object's own coefficients are neutral for products (1) and zero for sums, so the
    # combined value Bullet uses is the floor's, i.e. the drawn term.
    pb.changeDynamics(body, -1, linearDamping=0.0, angularDamping=0.0, physicsClientId=c,
                      **dyn)
    return body


def run(core: SimCore, seconds: float, probe: object) -> list:
    out = []
    for _ in range(int(seconds / 0.002)):
        core.advance(0.002)
        out.append(probe())  # type: ignore[operator]
    return out


def test_the_draw_sets_the_floor_coefficients() -> None:
    core = floor_core(lateral_friction=0.55, spinning_friction=0.02, rolling_friction=0.003,
                      restitution=0.4)
    try:
        info = pb.getDynamicsInfo(core.plant.floor, -1, physicsClientId=core.plant.client)
        # lateral, restitution, rolling, spinning
        assert np.allclose([info[1], info[5], info[6], info[7]], [0.55, 0.4, 0.003, 0.02])
        assert core.draw.plant.lateral_friction == 0.55
    finally:
        core.close()


def slide_distance(mu: float) -> float:
    core = floor_core(lateral_friction=mu)
    try:
        c = core.plant.client
        box = spawn(core, "box", [1.0, -1.0, 0.05], lateralFriction=1.0)
        run(core, 0.2, lambda: None)  # settle on the floor
        x0 = pb.getBasePositionAndOrientation(box, physicsClientId=c)[0][0]
        pb.resetBaseVelocity(box, [2.0, 0.0, 0.0], [0.0, 0.0, 0.0], physicsClientId=c)
        run(core, 1.5, lambda: None)
        return pb.getBasePositionAndOrientation(box, physicsClientId=c)[0][0] - x0
    finally:
        core.close()


def test_lateral_friction_sets_how_far_a_pushed_box_slides() -> None:
    # Coulomb sliding: d = v0^2 / (2 mu g)
    for mu in (0.3, 0.9):
        d = slide_distance(mu)
        assert abs(d - 2.0**2 / (2 * mu * G)) < 0.15 * 2.0**2 / (2 * mu * G), (mu, d)


def bounce_height(restitution: float) -> float:
    core = floor_core(restitution=restitution)
    try:
        c = core.plant.client
        ball = spawn(core, "sphere", [1.0, -1.0, 0.55], restitution=1.0)
        z = run(core, 1.2, lambda: pb.getBasePositionAndOrientation(
            ball, physicsClientId=c)[0][2])
        z = np.array(z)
        first_contact = int(np.argmax(z < 0.0505 + 0.005))
        return float(z[first_contact:].max() - 0.05)
    finally:
        core.close()


def test_restitution_sets_how_high_a_dropped_ball_bounces() -> None:
    dead, lively = bounce_height(0.0), bounce_height(0.6)
    assert dead < 0.01  # no bounce
    # h' = e^2 h for a 0.5 m drop (Bullet's contact softness costs a little)
    assert 0.5 * 0.6**2 * 0.5 < lively < 1.1 * 0.6**2 * 0.5, lively


def spin_after(spinning: float) -> float:
    core = floor_core(spinning_friction=spinning)
    try:
        c = core.plant.client
        # A ball touches at one point: only spinning friction resists a spin about the normal
        # (a box's four corner contacts would brake it by lateral friction alone).
        ball = spawn(core, "sphere", [1.0, -1.0, 0.05], lateralFriction=1.0)
        run(core, 0.2, lambda: None)
        pb.resetBaseVelocity(ball, [0.0, 0.0, 0.0], [0.0, 0.0, 10.0], physicsClientId=c)
        run(core, 0.3, lambda: None)
        return abs(pb.getBaseVelocity(ball, physicsClientId=c)[1][2])
    finally:
        core.close()


def test_spinning_friction_brakes_a_spinning_ball() -> None:
    free, braked = spin_after(0.0), spin_after(0.05)
    assert free > 9.0  # nothing brakes the spin about the contact normal
    assert braked < 0.7 * free


def roll_distance(rolling: float) -> float:
    core = floor_core(rolling_friction=rolling, lateral_friction=1.0)
    try:
        c = core.plant.client
        ball = spawn(core, "sphere", [1.0, -1.0, 0.05], lateralFriction=1.0)
        run(core, 0.2, lambda: None)
        x0 = pb.getBasePositionAndOrientation(ball, physicsClientId=c)[0][0]
        pb.resetBaseVelocity(ball, [1.0, 0.0, 0.0], [0.0, 1.0 / 0.05, 0.0], physicsClientId=c)
        run(core, 1.0, lambda: None)
        return pb.getBasePositionAndOrientation(ball, physicsClientId=c)[0][0] - x0
    finally:
        core.close()


def test_rolling_friction_stops_a_rolling_ball_sooner() -> None:
    free, braked = roll_distance(0.0), roll_distance(0.01)
    assert free > 0.9  # rolls on at ~1 m/s
    assert braked < 0.8 * free
