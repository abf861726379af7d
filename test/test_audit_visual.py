"""The visual row on real camera images: covered by randomized renders, or not."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from sim2real_ros.audit.visual import coverage, decode_image, image_stats, render_randomized
from sim2real_ros.cli import main
from sim2real_ros.sim.randomization import RandomizationSpec
from sim2real_ros.sysid.bags import BagWriter, joint_state_msg, typestore, unit_metadata

HOME = np.array([0.0, -0.5, 1.2, 0.0, 1.0, 0.0])
NAMES = ["shoulder_pan_joint", "shoulder_lift_joint", "elbow_joint", "wrist_1_joint",
         "wrist_2_joint", "wrist_3_joint"]


def image_msg(t_ns: int, img: np.ndarray) -> object:
    ts = typestore().types
    header = ts["std_msgs/msg/Header"](
        stamp=ts["builtin_interfaces/msg/Time"](sec=t_ns // 10**9, nanosec=t_ns % 10**9),
        frame_id="camera_optical_frame")
    h, w, _ = img.shape
    return ts["sensor_msgs/msg/Image"](header=header, height=h, width=w, encoding="rgb8",
                                       is_bigendian=0, step=3 * w,
                                       data=np.ascontiguousarray(img, dtype=np.uint8).ravel())


def camera_bag(path: Path, images: list[np.ndarray]) -> Path:
    with BagWriter(path, unit_metadata("arm-CAM")) as w:
        w.add_topic("/joint_states", "sensor_msgs/msg/JointState")
        w.add_topic("/camera/image_raw", "sensor_msgs/msg/Image")
        for k, img in enumerate(images):
            t = 10**9 + k * 100_000_000
            w.write_msg("/joint_states", t, joint_state_msg(NAMES, t, HOME, np.zeros(6)))
            w.write_msg("/camera/image_raw", t + 1000, image_msg(t, img))
    return path


def test_image_statistics_measure_what_they_name() -> None:
    flat = np.full((20, 30, 3), 128, dtype=np.uint8)
    s = image_stats(flat)
    assert s[0] == pytest.approx(128 / 255) and s[1] == pytest.approx(0.0)
    assert s[2] == pytest.approx(1.0) and s[4] == pytest.approx(0.0)
    noisy = np.clip(flat + np.random.default_rng(0).normal(0, 10, flat.shape), 0, 255)
    assert image_stats(noisy)[4] > 0.01
    reddish = flat.copy()
    reddish[:, :, 0] = 192
    assert image_stats(reddish)[2] == pytest.approx(1.5)
    frac, mask = coverage(np.array([s, s * 3]), np.array([s * 0.98, s * 1.02]))
    assert frac == 0.5 and mask.tolist() == [True, False]


def test_image_messages_decode_in_every_supported_encoding() -> None:
    img = np.arange(4 * 5 * 3, dtype=np.uint8).reshape(4, 5, 3)
    msg = image_msg(0, img)
    np.testing.assert_array_equal(decode_image(msg), img)
    msg.encoding = "bgr8"
    np.testing.assert_array_equal(decode_image(msg), img[:, :, ::-1])
    msg.encoding = "16UC1"
    with pytest.raises(ValueError, match="unsupported image encoding"):
        decode_image(msg)


def test_camera_images_covered_by_the_renders_turn_visual_green_and_a_dim_cell_red(
    tmp_path: Path,
) -> None:
    spec = RandomizationSpec.from_yaml(Path(__file__).resolve().parent.parent / "config"
                                       / "randomization.yaml")
    # The "real" camera: the same scene under appearance draws the audit never renders.
    real = render_randomized(spec, [HOME], n_renders=6, seed=1000)
    good = camera_bag(tmp_path / "good", real)
    assert main(["audit", "--bag", str(good), "--camera", "used", "-o",
                 str(tmp_path / "g")]) == 0
    report = json.loads((tmp_path / "g" / "audit.json").read_text())
    visual = next(r for r in report["rows"] if r["gap"] == "visual")
    assert visual["status"] == "green", visual
    assert any("100%" in e for e in visual["evidence"])
    # A cell lit at 40 % of anything the randomization produces: the renders do not cover it.
    dim = camera_bag(tmp_path / "dim", [(i * 0.4).astype(np.uint8) for i in real])
    assert main(["audit", "--bag", str(dim), "--camera", "used", "-o", str(tmp_path / "d")]) == 1
    report = json.loads((tmp_path / "d" / "audit.json").read_text())
    visual = next(r for r in report["rows"] if r["gap"] == "visual")
    assert visual["status"] == "red" and "don't match the camera" in visual["rule"]
