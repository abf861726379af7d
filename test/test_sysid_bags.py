"""Bag I/O: round trip through rosbags and the mcap reader, and clear errors for bad bags."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from mcap.reader import make_reader

from sim2real_ros.sysid import bags
from sim2real_ros.sysid.runs import RunError, load_run

NAMES = ["j0", "j1", "j2"]
META = bags.unit_metadata("SN-42", cell="cell-a", tool="gripper", date="2026-01-01",
                          operator_note="test", envelope_sha256="ab" * 32)


def _write(path: Path, n_js: int = 200, n_cmd: int = 40, names: list[str] = NAMES) -> Path:
    with bags.BagWriter(path, META) as bag:
        bag.add_topic("/joint_states", "sensor_msgs/msg/JointState", bags.make_qos())
        bag.add_topic("/forward_position_controller/commands", "std_msgs/msg/Float64MultiArray")
        bag.add_topic("/diagnostics", "diagnostic_msgs/msg/DiagnosticArray")
        bag.add_topic("/policy/joint_command", "sensor_msgs/msg/JointState")
        for k in range(n_js):
            t = 10**9 + k * 2_000_000
            bag.write_msg("/joint_states", t, bags.joint_state_msg(
                names, t, np.arange(len(names)) + 0.001 * k, np.ones(len(names)),
                np.full(len(names), 2.0)))
            if k % 5 == 0 and k // 5 < n_cmd:
                bag.write_msg("/forward_position_controller/commands", t,
                              bags.multiarray_msg(np.full(len(names), 0.1 * k)))
    return path


def _mcap_counts(path: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    (mcap_file,) = path.glob("*.mcap")
    with mcap_file.open("rb") as fh:
        for _schema, channel, _msg in make_reader(fh).iter_messages():
            counts[channel.topic] = counts.get(channel.topic, 0) + 1
    return counts


def test_round_trip_keeps_metadata_counts_and_reorders_joints(tmp_path: Path) -> None:
    p = _write(tmp_path / "run")
    info = bags.bag_info(p)
    assert info.metadata == META
    assert info.status == bags.STATUS_COMPLETE
    assert bags.count_messages(p) == {"/joint_states": 200,
                                      "/forward_position_controller/commands": 40,
                                      "/diagnostics": 0, "/policy/joint_command": 0}
    assert _mcap_counts(p) == {"/joint_states": 200, "/forward_position_controller/commands": 40}
    # the unit identity is readable without our code: metadata.yaml custom_data
    text = (p / "metadata.yaml").read_text()
    assert "unit.serial: SN-42" in text and "envelope_sha256" in text
    js = bags.read_joint_states(p, ["j2", "j0"])
    assert js.position.shape == (200, 2)
    np.testing.assert_allclose(js.position[0], [2.0, 0.0])
    np.testing.assert_allclose(js.t_s[1] - js.t_s[0], 0.002, atol=1e-6)
    cmds = bags.read_position_commands(p, 3, "forward_position_controller/commands")
    assert cmds.values.shape == (40, 3)


def test_writer_never_overwrites(tmp_path: Path) -> None:
    p = _write(tmp_path / "run")
    before = (p / "metadata.yaml").read_bytes()
    with pytest.raises(bags.BagError, match="never overwritten"):
        bags.BagWriter(p, META)
    assert (p / "metadata.yaml").read_bytes() == before


def test_truncated_mcap_is_reported(tmp_path: Path) -> None:
    p = _write(tmp_path / "run")
    (f,) = p.glob("*.mcap")
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with pytest.raises(bags.BagError, match="truncated or corrupt"):
        bags.read_joint_states(p)


def test_flipped_bytes_are_detected_by_the_sealed_hash(tmp_path: Path) -> None:
    p = _write(tmp_path / "run")
    (f,) = p.glob("*.mcap")
    data = bytearray(f.read_bytes())
    data[2000:2040] = b"\xff" * 40  # inside message payloads: still parses as numbers
    f.write_bytes(bytes(data))
    with pytest.raises(bags.BagError, match="sha256"):
        bags.read_joint_states(p)


def test_missing_metadata_means_an_unfinished_recording(tmp_path: Path) -> None:
    p = _write(tmp_path / "run")
    (p / "metadata.yaml").unlink()
    with pytest.raises(bags.BagError, match="never finished"):
        bags.bag_info(p)


def test_empty_bag_and_empty_file_are_errors(tmp_path: Path) -> None:
    p = _write(tmp_path / "empty", n_js=0, n_cmd=0)
    with pytest.raises(bags.BagError, match="empty bag"):
        bags.bag_info(p)
    q = _write(tmp_path / "zero")
    (f,) = q.glob("*.mcap")
    f.write_bytes(b"")
    with pytest.raises(bags.BagError, match="empty"):
        list(bags.read_messages(q))
    with pytest.raises(bags.BagError, match="does not exist"):
        bags.bag_info(tmp_path / "nope")


def test_missing_topic_and_wrong_joint_names_are_named(tmp_path: Path) -> None:
    p = _write(tmp_path / "run")
    with pytest.raises(bags.BagError, match="missing topic 'force_torque"):
        bags.read_wrench(p)
    with pytest.raises(bags.BagError, match=r"missing \['elbow_joint'\]"):
        bags.read_joint_states(p, ["j0", "elbow_joint"])
    with pytest.raises(bags.BagError, match="has type diagnostic_msgs/msg/DiagnosticArray"):
        bags.read_joint_states(p, topic="/diagnostics")
    with pytest.raises(bags.BagError, match="has no messages"):
        bags.read_joint_states(p, topic="policy/joint_command")


def test_aborted_recording_is_marked_and_refused_for_fitting(tmp_path: Path) -> None:
    p = tmp_path / "aborted"
    with pytest.raises(RuntimeError), bags.BagWriter(p, META) as bag:
        bag.add_topic("/joint_states", "sensor_msgs/msg/JointState")
        bag.write_msg("/joint_states", 10**9, bags.joint_state_msg(NAMES, 10**9, np.zeros(3)))
        raise RuntimeError("operator pulled the plug")
    info = bags.bag_info(p)
    assert info.status.startswith("aborted: RuntimeError")
    with pytest.raises(RunError, match="did not complete"):
        load_run(p, NAMES)


def test_raw_cdr_from_rclpy_with_padding_reads_back(tmp_path: Path) -> None:
    from rclpy.serialization import serialize_message
    from sensor_msgs.msg import JointState

    msg = JointState()
    msg.name = ["a"]
    msg.position = [1.25]
    raw = serialize_message(msg)
    p = tmp_path / "raw"
    with bags.BagWriter(p, META) as bag:
        bag.add_topic("/joint_states", "sensor_msgs/msg/JointState")
        bag.write("/joint_states", 5, raw)
    ((topic, t, back),) = list(bags.read_messages(p))
    assert (topic, t, list(back.name), list(back.position)) == ("/joint_states", 5, ["a"], [1.25])


def test_copy_of_a_bag_reads_the_same(tmp_path: Path) -> None:
    p = _write(tmp_path / "run")
    q = tmp_path / "copy"
    shutil.copytree(p, q)
    assert bags.count_messages(q) == bags.count_messages(p)
