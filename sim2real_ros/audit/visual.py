"""Do the randomized renders cover what the real camera sees? Image statistics, compared.

Each image is summarised by five numbers that appearance randomization is meant to cover:
brightness (mean grey), contrast (grey std), colour balance (mean red/green and blue/green), and
pixel noise (std of the image minus its 3x3 box blur). A real image is covered when each of its
numbers lies inside the range the simulator's renders span, widened by 10 % of that range or a
floor per statistic. The fraction covered is the visual row's evidence.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from sim2real_ros.audit.evidence import ImageCoverage

STAT_NAMES = ("brightness", "contrast", "red_green", "blue_green", "pixel_noise")
# Widening floors on the 0..1 intensity scale: a few 8-bit counts, 2 % in colour ratio.
STAT_FLOORS = np.array([0.02, 0.01, 0.02, 0.02, 0.002])
IMAGE_TOPIC = "camera/image_raw"


def image_stats(image: np.ndarray) -> np.ndarray:
    """Return [brightness, contrast, red/green, blue/green, pixel noise] of an HxWx3 image."""
    img = np.asarray(image, dtype=float)
    if img.ndim == 2:
        img = np.repeat(img[:, :, None], 3, axis=2)
    if img.ndim != 3 or img.shape[2] != 3 or min(img.shape[:2]) < 3:
        raise ValueError(f"expected an HxWx3 image (H, W >= 3), got shape {img.shape}")
    if img.max() > 1.0:
        img = img / 255.0
    grey = img.mean(axis=2)
    mean_rgb = img.reshape(-1, 3).mean(axis=0)
    g = max(float(mean_rgb[1]), 1e-6)
    # 3x3 box blur by summing shifted copies of the interior.
    h, w = grey.shape
    blur = sum(grey[1 + dy:h - 1 + dy, 1 + dx:w - 1 + dx]
               for dy in (-1, 0, 1) for dx in (-1, 0, 1)) / 9.0
    noise = float((grey[1:-1, 1:-1] - blur).std())
    return np.array([grey.mean(), grey.std(), mean_rgb[0] / g, mean_rgb[2] / g, noise])


def coverage(real: np.ndarray, sim: np.ndarray, widen: float = 0.1,
             floors: np.ndarray = STAT_FLOORS) -> tuple[float, np.ndarray]:
    """Return the fraction of real images inside the sim's widened ranges, and the mask."""
    real = np.atleast_2d(real)
    sim = np.atleast_2d(sim)
    lo, hi = sim.min(axis=0), sim.max(axis=0)
    pad = np.maximum(widen * (hi - lo), floors)
    inside = np.all((real >= lo - pad) & (real <= hi + pad), axis=1)
    return float(inside.mean()) if inside.size else 0.0, inside


def decode_image(msg: Any) -> np.ndarray:
    """Return an HxWx3 uint8 array from a sensor_msgs/Image (rgb8, bgr8 or mono8)."""
    h, w, enc = int(msg.height), int(msg.width), str(msg.encoding)
    data = np.frombuffer(bytes(msg.data), dtype=np.uint8)
    step = int(msg.step)
    if enc in ("rgb8", "bgr8"):
        arr = data[: h * step].reshape(h, step)[:, : 3 * w].reshape(h, w, 3)
        return arr[:, :, ::-1] if enc == "bgr8" else arr
    if enc == "mono8":
        arr = data[: h * step].reshape(h, step)[:, :w]
        return np.repeat(arr[:, :, None], 3, axis=2)
    raise ValueError(f"unsupported image encoding {enc!r}: expected rgb8, bgr8 or mono8")


def images_from_bag(bag_path: str | Path, max_images: int = 40
                    ) -> tuple[list[np.ndarray], list[np.ndarray | None]]:
    """Return up to `max_images` evenly spaced camera images and the joint positions then."""
    from sim2real_ros.audit.latency import topic_matches
    from sim2real_ros.sysid.bags import bag_info, read_messages

    topics = list(bag_info(bag_path).topics)
    cam = [t for t in topics if topic_matches(t, IMAGE_TOPIC)]
    if not cam:
        return [], []
    wanted = cam + [t for t in topics if topic_matches(t, "joint_states")]
    frames: list[tuple[np.ndarray, np.ndarray | None]] = []
    last_q: np.ndarray | None = None
    for topic, _, msg in read_messages(bag_path, wanted):
        if topic in cam:
            frames.append((decode_image(msg), last_q))
        else:
            last_q = np.asarray(msg.position, dtype=float)
    if len(frames) > max_images:
        idx = np.linspace(0, len(frames) - 1, max_images).round().astype(int)
        frames = [frames[i] for i in idx]
    return [f[0] for f in frames], [f[1] for f in frames]


def render_randomized(spec: Any, poses: list[np.ndarray | None], n_renders: int = 40,
                      seed: int = 0, calibration: Any = None) -> list[np.ndarray]:
    """Render the simulated camera over `n_renders` randomization draws at the given poses."""
    from sim2real_ros.sim.core import SimCore

    core = SimCore(spec, seed=seed, calibration=calibration, floor=True)
    try:
        out = []
        for k in range(n_renders):
            pose = poses[k % len(poses)] if poses else None
            q0 = pose if pose is not None and len(pose) == core.n else None
            core.reset(seed=seed + k, q0=q0)
            out.append(core.render())
        return out
    finally:
        core.close()


def image_coverage(real: list[np.ndarray], rendered: list[np.ndarray], source: str
                   ) -> ImageCoverage:
    """Return the coverage evidence of real images by rendered ones."""
    if not real or not rendered:
        raise ValueError("need at least one real and one rendered image")
    frac, _ = coverage(np.array([image_stats(i) for i in real]),
                       np.array([image_stats(i) for i in rendered]))
    return ImageCoverage(frac, len(real), len(rendered), source)
