"""rosbag2 (MCAP storage) bags written and read with `rosbags`, as `ros2 bag` on a cell reads them.

The recorder writes the CDR bytes it received (rclpy `raw=True` subscriptions) without
re-serializing; the bag's identity (unit serial, cell, tool, date, operator note, the safety
envelope's sha256) goes into metadata.yaml `custom_data`, which `ros2 bag info` prints.
Readers turn empty, truncated or corrupt bags, missing topics and wrong joint names into a
`BagError` that names the bag and what is wrong.
"""

from __future__ import annotations

import hashlib
import json
import struct
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
from rosbags.interfaces import (
    Qos,
    QosDurability,
    QosHistory,
    QosLiveliness,
    QosReliability,
    QosTime,
)
from rosbags.rosbag2 import Reader, Writer
from rosbags.rosbag2.enums import StoragePlugin
from rosbags.typesys import Stores, get_types_from_msg, get_typestore
from rosbags.typesys.store import Typestore
from ruamel.yaml import YAML

# custom_data keys: the full metadata as JSON (typed round trip) plus flat dotted copies so a
# person running `ros2 bag info` reads the unit identity without decoding JSON.
METADATA_KEY = "sim2real_ros.metadata"
STATUS_KEY = "sim2real_ros.status"
# rosbags writes MCAP chunks without CRCs, so a flipped byte would read back as a plausible
# number; the file's sha256 in metadata.yaml makes silent corruption detectable.
SHA_KEY = "sim2real_ros.mcap_sha256"
STATUS_COMPLETE = "complete"
BAG_VERSION = 9  # rosbag2 format of Jazzy/Kilted; `ros2 bag` of Humble reads version <= 5 only.

JOINT_STATES = "joint_states"
POSITION_COMMANDS = "forward_position_controller/commands"
WRENCH = "force_torque_sensor_broadcaster/wrench"
DIAGNOSTICS = "/diagnostics"
JOINT_COMMAND = "policy/joint_command"


class BagError(ValueError):
    """A bag cannot be written or read as asked; the message names the bag and the problem."""

    def __init__(self, path: str | Path, problem: str) -> None:
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


@lru_cache(maxsize=1)
def typestore() -> Typestore:
    """Return the message type store (ROS 2 Kilted definitions plus any type found on disk)."""
    return get_typestore(Stores.ROS2_KILTED)


def _msg_search_dirs() -> list[Path]:
    dirs = [Path(sys.prefix) / "share"]
    import os

    for prefix in os.environ.get("AMENT_PREFIX_PATH", "").split(os.pathsep):
        if prefix:
            dirs.append(Path(prefix) / "share")
    return dirs


def ensure_msgtype(msgtype: str) -> None:
    """Make `msgtype` ('pkg/msg/Name') known to the type store, loading .msg files if needed."""
    store = typestore()
    if msgtype in store.fielddefs:
        return
    pending = [msgtype]
    types: dict[str, Any] = {}
    while pending:
        name = pending.pop()
        if name in store.fielddefs or name in types:
            continue
        pkg, kind, short = _split_msgtype(name)
        text = None
        for share in _msg_search_dirs():
            candidate = share / pkg / kind / f"{short}.msg"
            if candidate.is_file():
                text = candidate.read_text()
                break
        if text is None:
            raise BagError(
                "<typestore>",
                f"message type {name!r} is unknown and no {pkg}/{kind}/{short}.msg was found "
                f"under {[str(d) for d in _msg_search_dirs()]}",
            )
        parsed = get_types_from_msg(text, name)
        types.update(parsed)
        for _, fields in parsed.values():
            for _, desc in fields:
                pending.extend(_nested_names(desc))
    store.register(types)


def _split_msgtype(msgtype: str) -> tuple[str, str, str]:
    parts = msgtype.split("/")
    if len(parts) == 2:
        return parts[0], "msg", parts[1]
    if len(parts) == 3:
        return parts[0], parts[1], parts[2]
    raise BagError("<typestore>", f"message type {msgtype!r}: expected 'pkg/msg/Name'")


def _nested_names(desc: Any) -> list[str]:
    # rosbags field descriptors: (kind, payload); kind 2 = NAME, sequences/arrays nest one level.
    out: list[str] = []
    if isinstance(desc, tuple) and len(desc) == 2:
        kind, payload = desc
        if getattr(kind, "name", "") == "NAME" and isinstance(payload, str):
            out.append(payload)
        elif isinstance(payload, tuple):
            out.extend(_nested_names(payload[0] if len(payload) == 2 else payload))
    return out


def make_qos(reliable: bool = True, transient_local: bool = False, depth: int = 10) -> Qos:
    """Return the offered QoS recorded for a topic (`ros2 bag play` re-offers it)."""
    zero = QosTime(0, 0)
    return Qos(
        history=QosHistory.KEEP_LAST,
        depth=depth,
        reliability=QosReliability.RELIABLE if reliable else QosReliability.BEST_EFFORT,
        durability=QosDurability.TRANSIENT_LOCAL if transient_local else QosDurability.VOLATILE,
        deadline=zero,
        lifespan=zero,
        liveliness=QosLiveliness.AUTOMATIC,
        liveliness_lease_duration=zero,
        avoid_ros_namespace_conventions=False,
    )


def _flatten(prefix: str, value: Any, out: dict[str, str]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    elif isinstance(value, (list, tuple)):
        out[prefix] = json.dumps(list(value))
    else:
        out[prefix] = "" if value is None else str(value)


def unit_metadata(
    serial: str,
    cell: str = "",
    tool: str = "",
    date: str = "",
    operator_note: str = "",
    envelope_sha256: str = "",
    **extra: Any,
) -> dict[str, Any]:
    """Return bag metadata in the layout every sysid tool reads (unit identity + envelope hash)."""
    if not serial:
        raise ValueError("unit serial must not be empty: a bag must name the unit it measured")
    meta: dict[str, Any] = {
        "unit": {
            "serial": serial,
            "cell": cell,
            "tool": tool,
            "date": date,
            "operator_note": operator_note,
        },
        "envelope_sha256": envelope_sha256,
    }
    meta.update(extra)
    return meta


class BagWriter:
    """Write a rosbag2 MCAP bag of raw CDR messages; refuses to touch an existing path.

    Use as a context manager. If the block raises, what was recorded so far is still closed
    into a readable bag, marked `sim2real_ros.status: aborted: <reason>` so fitting refuses it.
    """

    def __init__(self, path: str | Path, metadata: dict[str, Any] | None = None) -> None:
        self.path = Path(path)
        if self.path.exists():
            raise BagError(self.path, "exists already; a bag is never overwritten")
        try:
            json.dumps(metadata or {})
        except (TypeError, ValueError) as exc:
            raise BagError(self.path, f"metadata must be JSON-serializable ({exc})") from exc
        self.metadata: dict[str, Any] = dict(metadata or {})
        self._writer: Writer | None = None
        self._connections: dict[str, Any] = {}
        self.counts: dict[str, int] = {}
        self.status = STATUS_COMPLETE

    def open(self) -> BagWriter:
        """Create the bag directory and the MCAP file."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        writer = Writer(self.path, version=BAG_VERSION, storage_plugin=StoragePlugin.MCAP)
        try:
            writer.open()
        except Exception as exc:  # noqa: BLE001 - any failure to create is a BagError here
            raise BagError(self.path, f"cannot create bag ({exc})") from exc
        self._writer = writer
        return self

    def __enter__(self) -> BagWriter:
        return self.open()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None and self.status == STATUS_COMPLETE:
            self.status = f"aborted: {exc_type.__name__}: {exc}"
        self.close()

    @property
    def is_open(self) -> bool:
        """Return True between open() and close()."""
        return self._writer is not None

    def add_topic(self, topic: str, msgtype: str, qos: Qos | None = None) -> None:
        """Register a topic ('joint_states', 'sensor_msgs/msg/JointState') before writing to it."""
        writer = self._require_open()
        if topic in self._connections:
            raise BagError(self.path, f"topic {topic!r} added twice")
        ensure_msgtype(msgtype)
        self._connections[topic] = writer.add_connection(
            topic,
            msgtype,
            typestore=typestore(),
            offered_qos_profiles=[qos] if qos is not None else [],
        )
        self.counts[topic] = 0

    def has_topic(self, topic: str) -> bool:
        """Return True if the topic was added."""
        return topic in self._connections

    def write(self, topic: str, t_ns: int, cdr_bytes: bytes | memoryview) -> None:
        """Append one serialized message received at t_ns (the bag's log time)."""
        writer = self._require_open()
        conn = self._connections.get(topic)
        if conn is None:
            raise BagError(self.path, f"topic {topic!r} was not added (have {sorted(self.counts)})")
        writer.write(conn, int(t_ns), cdr_bytes)
        self.counts[topic] += 1

    def write_msg(self, topic: str, t_ns: int, msg: object) -> None:
        """Serialize a rosbags message object and append it (for bags made without rclpy)."""
        conn = self._connections.get(topic)
        if conn is None:
            raise BagError(self.path, f"topic {topic!r} was not added (have {sorted(self.counts)})")
        self.write(topic, t_ns, typestore().serialize_cdr(msg, conn.msgtype))

    def close(self) -> None:
        """Write metadata.yaml (with custom_data) and the MCAP summary; safe to call twice."""
        writer, self._writer = self._writer, None
        if writer is None:
            return
        flat: dict[str, str] = {}
        _flatten("", self.metadata, flat)
        for key, value in flat.items():
            writer.set_custom_data(key, value)
        writer.set_custom_data(METADATA_KEY, json.dumps(self.metadata, sort_keys=True))
        writer.set_custom_data(STATUS_KEY, self.status)
        writer.close()
        _seal(self.path)

    def _require_open(self) -> Writer:
        if self._writer is None:
            raise BagError(self.path, "bag is not open (use `with BagWriter(...) as bag:`)")
        return self._writer


@dataclass
class TopicInfo:
    """One topic of a bag."""

    msgtype: str
    count: int


@dataclass
class BagInfo:
    """What `ros2 bag info` shows, plus our metadata."""

    path: Path
    start_ns: int
    duration_ns: int
    message_count: int
    topics: dict[str, TopicInfo]
    metadata: dict[str, Any]
    status: str


def _mcap_files(path: Path) -> list[Path]:
    return sorted(path.glob("*.mcap")) if path.is_dir() else [path]


def _files_sha256(files: list[Path]) -> str:
    h = hashlib.sha256()
    for f in files:
        with f.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def _seal(path: Path) -> None:
    """Add the MCAP file's sha256 to metadata.yaml custom_data (atomic rewrite)."""
    meta_path = path / "metadata.yaml"
    yaml = YAML(typ="safe")
    yaml.default_flow_style = False
    doc = yaml.load(meta_path.read_text())
    info = doc["rosbag2_bagfile_information"]
    custom = dict(info.get("custom_data") or {})
    custom[SHA_KEY] = _files_sha256(_mcap_files(path))
    info["custom_data"] = custom
    tmp = meta_path.with_suffix(".yaml.tmp")
    with tmp.open("w") as fh:
        yaml.dump(doc, fh)
    tmp.replace(meta_path)


def verify_bag(path: str | Path) -> None:
    """Raise BagError if the MCAP bytes differ from the sha256 sealed at close (ours only)."""
    p = Path(path)
    _check_path(p)
    if not p.is_dir():
        return
    reader = _open_reader(p)
    try:
        expected = _custom_data(reader).get(SHA_KEY)
    finally:
        reader.close()
    if expected and _files_sha256(_mcap_files(p)) != expected:
        raise BagError(p, "corrupt bag: MCAP file sha256 differs from the one sealed at close")


def resolve_topic(path: Path, available: Iterable[str], topic: str) -> str:
    """Match a relative topic name ('joint_states') to the recorded one ('/ns/joint_states')."""
    names = list(available)
    if topic in names:
        return topic
    if not topic.startswith("/"):
        hits = [n for n in names if n == "/" + topic or n.endswith("/" + topic)]
        if len(hits) == 1:
            return hits[0]
        if len(hits) > 1:
            raise BagError(path, f"topic {topic!r} is ambiguous: {hits}")
    raise BagError(path, f"missing topic {topic!r}; the bag has {sorted(names)}")


def _check_path(path: Path) -> None:
    if not path.exists():
        raise BagError(path, "does not exist")
    if path.is_dir() and not (path / "metadata.yaml").is_file():
        if any(path.glob("*.mcap")):
            raise BagError(
                path,
                "metadata.yaml is missing: the recording never finished (truncated bag); "
                "the .mcap file alone may be partial",
            )
        raise BagError(path, "is not a rosbag2 bag (no metadata.yaml)")
    if path.is_file() and path.suffix != ".mcap":
        raise BagError(path, f"unsupported file type {path.suffix!r}: expected a bag directory")


def _open_reader(path: Path) -> Reader:
    _check_path(path)
    try:
        reader = Reader(path)
        reader.open()
    except BagError:
        raise
    except Exception as exc:  # noqa: BLE001 - rosbags raises several types for bad files
        text = str(exc)
        if "magic" in text.lower() or "footer" in text.lower() or "summary" in text.lower():
            raise BagError(path, f"truncated or corrupt MCAP file ({text})") from exc
        if "empty" in text.lower():
            raise BagError(path, f"empty bag file ({text})") from exc
        raise BagError(path, f"corrupt bag ({type(exc).__name__}: {text})") from exc
    return reader


def _custom_data(reader: Reader) -> dict[str, str]:
    storage = reader.storage
    custom = getattr(getattr(storage, "metadata", None), "custom", None)
    return dict(custom or {})


def bag_info(path: str | Path) -> BagInfo:
    """Return topics, counts, times and metadata of a bag; BagError if unreadable or empty."""
    p = Path(path)
    reader = _open_reader(p)
    try:
        topics = {
            name: TopicInfo(info.msgtype or "?", int(info.msgcount))
            for name, info in reader.topics.items()
        }
        custom = _custom_data(reader)
        count = int(reader.message_count)
        start = int(reader.start_time) if count else 0
        duration = int(reader.duration) if count else 0
    finally:
        reader.close()
    if count == 0:
        raise BagError(p, "empty bag: no messages recorded")
    meta_json = custom.get(METADATA_KEY)
    try:
        metadata = json.loads(meta_json) if meta_json else {}
    except json.JSONDecodeError as exc:
        raise BagError(p, f"custom_data {METADATA_KEY} is not valid JSON ({exc})") from exc
    return BagInfo(p, start, duration, count, topics, metadata, custom.get(STATUS_KEY, "unknown"))


def bag_metadata(path: str | Path) -> dict[str, Any]:
    """Return the metadata dict the bag was written with (unit identity, envelope hash, ...)."""
    return bag_info(path).metadata


def deserialize(raw: bytes | memoryview, msgtype: str) -> Any:
    """Deserialize CDR bytes; tolerate the trailing padding Fast DDS leaves after a message."""
    store = typestore()
    ensure_msgtype(msgtype)
    if len(raw) < 4 or bytes(raw[:2]) not in (b"\x00\x00", b"\x00\x01"):
        raise ValueError("invalid CDR encapsulation header")
    msgdef = store.get_msgdef(msgtype)
    func = msgdef.deserialize_cdr_le if raw[1] else msgdef.deserialize_cdr_be
    msg, _pos = func(memoryview(raw)[4:], 0, msgdef.cls, store)
    return msg


def read_messages(
    bag_path: str | Path, topics: Iterable[str] | None = None
) -> Iterator[tuple[str, int, Any]]:
    """Yield (topic, log time ns, deserialized message) in log-time order.

    Raises BagError for a missing, empty, truncated or corrupt bag, for requested topics the
    bag lacks, and (after the last message) when fewer messages were read than the index says.
    """
    p = Path(bag_path)
    verify_bag(p)
    reader = _open_reader(p)
    try:
        available = reader.topics
        if reader.message_count == 0:
            raise BagError(p, "empty bag: no messages recorded")
        if topics is None:
            wanted = list(available)
        else:
            wanted = list(dict.fromkeys(resolve_topic(p, available, t) for t in topics))
        conns = [c for c in reader.connections if c.topic in wanted]
        expected = {t: int(available[t].msgcount) for t in wanted}
        seen = dict.fromkeys(wanted, 0)
        iterator = reader.messages(connections=conns)
        while True:
            try:
                item = next(iterator)
            except StopIteration:
                break
            except BagError:
                raise
            except Exception as exc:  # noqa: BLE001 - bad records surface as many types
                raise BagError(p, f"corrupt message data ({type(exc).__name__}: {exc})") from exc
            conn, t_ns, raw = item
            try:
                msg = deserialize(raw, conn.msgtype)
            except (struct.error, ValueError, UnicodeDecodeError, IndexError) as exc:
                raise BagError(
                    p, f"corrupt message on {conn.topic!r} at t={t_ns} ns ({exc})"
                ) from exc
            seen[conn.topic] += 1
            yield conn.topic, int(t_ns), msg
        short = {t: (seen[t], expected[t]) for t in wanted if seen[t] != expected[t]}
        if short:
            raise BagError(
                p, f"truncated or corrupt bag: read/indexed message counts differ {short}"
            )
    finally:
        reader.close()


def count_messages(bag_path: str | Path) -> dict[str, int]:
    """Return messages per topic as the bag's index records them."""
    return {t: i.count for t, i in bag_info(bag_path).topics.items()}


# --- arrays --------------------------------------------------------------------------------


@dataclass
class JointTrajectory:
    """Joint states of one bag in the requested joint order; times in seconds."""

    joint_names: list[str]
    t_s: np.ndarray  # header stamps (when measured)
    recv_t_s: np.ndarray  # bag log times (when the recorder received them)
    position: np.ndarray  # (T, n) rad
    velocity: np.ndarray | None  # (T, n) rad/s
    effort: np.ndarray | None  # (T, n) N·m

    def __len__(self) -> int:
        return int(self.t_s.size)


@dataclass
class CommandSeries:
    """Commands as they were sent (Float64MultiArray) or asked (JointState); times in seconds."""

    t_s: np.ndarray  # log time (received by the recorder ≈ sent)
    values: np.ndarray  # (T, n)
    stamp_s: np.ndarray | None = None  # header stamps where the message has one


@dataclass
class WrenchSeries:
    """F/T samples [fx, fy, fz, tx, ty, tz] (N, N·m)."""

    t_s: np.ndarray
    recv_t_s: np.ndarray
    wrench: np.ndarray  # (T, 6)
    frame_id: str = ""


def _stamp_s(stamp: Any) -> float:
    return float(stamp.sec) + 1e-9 * float(stamp.nanosec)


def _require_type(p: Path, topic: str, expected: str) -> str:
    info = bag_info(p)
    topic = resolve_topic(p, info.topics, topic)
    got = info.topics[topic].msgtype
    if got != expected:
        raise BagError(p, f"topic {topic!r} has type {got}, expected {expected}")
    if info.topics[topic].count == 0:
        raise BagError(p, f"topic {topic!r} has no messages")
    return topic


def read_joint_states(
    bag_path: str | Path, joint_names: list[str] | None = None, topic: str = JOINT_STATES
) -> JointTrajectory:
    """Return the bag's joint states reordered to `joint_names` (default: as recorded).

    Wrong or missing joint names, or a field whose length differs from `name`, raise BagError.
    Velocity/effort are None when the publisher left them empty.
    """
    p = Path(bag_path)
    topic = _require_type(p, topic, "sensor_msgs/msg/JointState")
    stamps: list[float] = []
    recv: list[float] = []
    pos: list[np.ndarray] = []
    vel: list[np.ndarray] = []
    eff: list[np.ndarray] = []
    names: list[str] | None = joint_names
    order: list[int] | None = None
    have_vel = have_eff = True
    last_names: list[str] | None = None
    for _, t_ns, msg in read_messages(p, [topic]):
        msg_names = list(msg.name)
        if msg_names != last_names:
            if names is None:
                names = msg_names
            index = {n: i for i, n in enumerate(msg_names)}
            missing = [n for n in names if n not in index]
            if missing or len(index) != len(msg_names):
                raise BagError(
                    p,
                    f"{topic}: joint names {msg_names} at t={t_ns} ns do not contain the "
                    f"expected joints {names} (missing {missing})",
                )
            order = [index[n] for n in names]
            last_names = msg_names
        assert order is not None
        k = len(msg_names)
        if len(msg.position) != k:
            raise BagError(p, f"{topic}: {len(msg.position)} positions for {k} names at {t_ns}")
        stamps.append(_stamp_s(msg.header.stamp))
        recv.append(t_ns * 1e-9)
        pos.append(np.asarray(msg.position, dtype=float)[order])
        have_vel = have_vel and len(msg.velocity) == k
        have_eff = have_eff and len(msg.effort) == k
        if have_vel:
            vel.append(np.asarray(msg.velocity, dtype=float)[order])
        if have_eff:
            eff.append(np.asarray(msg.effort, dtype=float)[order])
    assert names is not None
    return JointTrajectory(
        joint_names=list(names),
        t_s=np.asarray(stamps),
        recv_t_s=np.asarray(recv),
        position=np.vstack(pos),
        velocity=np.vstack(vel) if have_vel else None,
        effort=np.vstack(eff) if have_eff else None,
    )


def read_position_commands(
    bag_path: str | Path, n_joints: int, topic: str = POSITION_COMMANDS
) -> CommandSeries:
    """Return forward_position_controller commands as sent; a wrong length raises BagError."""
    p = Path(bag_path)
    topic = _require_type(p, topic, "std_msgs/msg/Float64MultiArray")
    t: list[float] = []
    vals: list[np.ndarray] = []
    for _, t_ns, msg in read_messages(p, [topic]):
        data = np.asarray(msg.data, dtype=float)
        if data.shape != (n_joints,):
            raise BagError(
                p, f"{topic}: command at t={t_ns} ns has {data.size} values, expected {n_joints}"
            )
        t.append(t_ns * 1e-9)
        vals.append(data)
    return CommandSeries(np.asarray(t), np.vstack(vals))


def read_joint_commands(
    bag_path: str | Path, joint_names: list[str], topic: str = JOINT_COMMAND
) -> CommandSeries:
    """Return JointState commands (policy/joint_command) in `joint_names` order."""
    traj = read_joint_states(bag_path, joint_names, topic)
    return CommandSeries(traj.recv_t_s, traj.position, traj.t_s)


def read_wrench(bag_path: str | Path, topic: str = WRENCH) -> WrenchSeries:
    """Return the F/T samples of a bag."""
    p = Path(bag_path)
    topic = _require_type(p, topic, "geometry_msgs/msg/WrenchStamped")
    t: list[float] = []
    recv: list[float] = []
    w: list[list[float]] = []
    frame = ""
    for _, t_ns, msg in read_messages(p, [topic]):
        f, q = msg.wrench.force, msg.wrench.torque
        t.append(_stamp_s(msg.header.stamp))
        recv.append(t_ns * 1e-9)
        w.append([f.x, f.y, f.z, q.x, q.y, q.z])
        frame = msg.header.frame_id
    return WrenchSeries(np.asarray(t), np.asarray(recv), np.asarray(w, dtype=float), frame)


# --- message builders for bags made without rclpy (synthetic runs, conversions) -----------


def _time(t_ns: int) -> Any:
    T = typestore().types["builtin_interfaces/msg/Time"]
    return T(sec=int(t_ns) // 1_000_000_000, nanosec=int(t_ns) % 1_000_000_000)


def _header(t_ns: int, frame_id: str = "") -> Any:
    H = typestore().types["std_msgs/msg/Header"]
    return H(stamp=_time(t_ns), frame_id=frame_id)


def joint_state_msg(
    joint_names: list[str],
    stamp_ns: int,
    position: np.ndarray,
    velocity: np.ndarray | None = None,
    effort: np.ndarray | None = None,
) -> Any:
    """Build a sensor_msgs/JointState (rosbags object)."""
    JS = typestore().types["sensor_msgs/msg/JointState"]
    empty = np.zeros(0, dtype=np.float64)
    return JS(
        header=_header(stamp_ns),
        name=list(joint_names),
        position=np.asarray(position, dtype=np.float64),
        velocity=empty if velocity is None else np.asarray(velocity, dtype=np.float64),
        effort=empty if effort is None else np.asarray(effort, dtype=np.float64),
    )


def multiarray_msg(values: np.ndarray, label: str = "joints") -> Any:
    """Build a std_msgs/Float64MultiArray as forward_command_controller expects it."""
    ts = typestore().types
    data = np.asarray(values, dtype=np.float64).ravel()
    dim = ts["std_msgs/msg/MultiArrayDimension"](label=label, size=data.size, stride=data.size)
    layout = ts["std_msgs/msg/MultiArrayLayout"](dim=[dim], data_offset=0)
    return ts["std_msgs/msg/Float64MultiArray"](layout=layout, data=data)


def wrench_msg(stamp_ns: int, frame_id: str, wrench: np.ndarray) -> Any:
    """Build a geometry_msgs/WrenchStamped."""
    ts = typestore().types
    w = [float(v) for v in np.asarray(wrench, dtype=float).ravel()]
    V = ts["geometry_msgs/msg/Vector3"]
    body = ts["geometry_msgs/msg/Wrench"](force=V(x=w[0], y=w[1], z=w[2]),
                                          torque=V(x=w[3], y=w[4], z=w[5]))
    return ts["geometry_msgs/msg/WrenchStamped"](header=_header(stamp_ns, frame_id), wrench=body)


@dataclass
class TopicSpec:
    """A topic to write: name, type and offered QoS."""

    name: str
    msgtype: str
    qos: Qos | None = field(default=None)


STANDARD_TOPICS: dict[str, str] = {
    JOINT_STATES: "sensor_msgs/msg/JointState",
    POSITION_COMMANDS: "std_msgs/msg/Float64MultiArray",
    WRENCH: "geometry_msgs/msg/WrenchStamped",
    DIAGNOSTICS: "diagnostic_msgs/msg/DiagnosticArray",
    JOINT_COMMAND: "sensor_msgs/msg/JointState",
}
