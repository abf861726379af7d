"""A fixed RGB camera on the cell, rendered by PyBullet's CPU renderer, visually randomized."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pybullet as pb


@dataclass
class VisualParams:
    """Appearance of the scene: light, colours, sensor noise."""

    light_direction: np.ndarray = field(default_factory=lambda: np.array([1.0, 1.0, 2.0]))
    light_ambient: float = 0.6
    light_diffuse: float = 0.35
    arm_rgb: np.ndarray = field(default_factory=lambda: np.array([0.6, 0.6, 0.62]))
    floor_rgb: np.ndarray = field(default_factory=lambda: np.array([0.35, 0.35, 0.35]))
    pixel_noise_std: float = 0.0  # in 8-bit counts


@dataclass(frozen=True)
class CameraConfig:
    """Where the camera is and what it sees (pinhole, OpenGL conventions)."""

    width: int = 160
    height: int = 120
    eye_m: tuple[float, float, float] = (1.8, 1.2, 1.2)
    target_m: tuple[float, float, float] = (0.0, 0.0, 0.5)
    fov_deg: float = 60.0
    near_m: float = 0.05
    far_m: float = 5.0


def _rgba(rgb: np.ndarray) -> list[float]:
    return [*np.clip(np.asarray(rgb, dtype=float), 0.0, 1.0).tolist(), 1.0]


def render(
    client: int,
    body: int,
    floor: int,
    visual: VisualParams,
    rng: np.random.Generator,
    config: CameraConfig | None = None,
) -> np.ndarray:
    """Return an (H, W, 3) uint8 image of the cell with the given appearance."""
    cfg = config or CameraConfig()
    for link in range(-1, pb.getNumJoints(body, physicsClientId=client)):
        pb.changeVisualShape(body, link, rgbaColor=_rgba(visual.arm_rgb), physicsClientId=client)
    if floor >= 0:
        pb.changeVisualShape(floor, -1, rgbaColor=_rgba(visual.floor_rgb), physicsClientId=client)
    view = pb.computeViewMatrix(cfg.eye_m, cfg.target_m, (0, 0, 1), physicsClientId=client)
    proj = pb.computeProjectionMatrixFOV(
        cfg.fov_deg, cfg.width / cfg.height, cfg.near_m, cfg.far_m, physicsClientId=client
    )
    light = np.asarray(visual.light_direction, dtype=float)
    norm = float(np.linalg.norm(light))
    light = light / norm if norm > 0 else np.array([0.0, 0.0, 1.0])
    _, _, rgba, _, _ = pb.getCameraImage(
        cfg.width,
        cfg.height,
        view,
        proj,
        lightDirection=light.tolist(),
        lightAmbientCoeff=float(visual.light_ambient),
        lightDiffuseCoeff=float(visual.light_diffuse),
        shadow=0,
        renderer=pb.ER_TINY_RENDERER,
        physicsClientId=client,
    )
    img = np.asarray(rgba, dtype=np.uint8).reshape(cfg.height, cfg.width, 4)[:, :, :3]
    if visual.pixel_noise_std > 0:
        noisy = img.astype(float) + rng.normal(0.0, visual.pixel_noise_std, img.shape)
        img = np.clip(np.round(noisy), 0, 255).astype(np.uint8)
    return img
