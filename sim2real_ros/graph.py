"""One description of the whole sim2real graph for a backend (sim | real).

Everything that starts the graph reads it from here: `launch/sim2real.launch.py` translates it to
launch_ros Node actions on a cell, and `sim2real run` (runner.py) starts it as processes where
`ros2 launch` is absent. The backend file (config/backends/<backend>.yaml) says which driver
nodes to start and which topic names the arm speaks; nothing else in the graph knows which
backend runs.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from sim2real_ros.config import ConfigError, load_yaml
from sim2real_ros.paths import PACKAGE, share_path

BACKENDS = ("sim", "real")
ROLLOUT_STAGES = ("shadow", "advisory", "limited", "full")
COMMAND_INTERFACES = ("forward_position_controller", "joint_trajectory_controller")

# The driver-facing topics of the contract (relative names as the nodes use them) and the key
# under which a backend file names them.
DRIVER_TOPICS = {
    "joint_states": "joint_states",
    "wrench": "force_torque_sensor_broadcaster/wrench",
    "position_command": "forward_position_controller/commands",
    "effort_command": "forward_effort_controller/commands",
    "trajectory_command": "joint_trajectory_controller/joint_trajectory",
}
# In joint_trajectory_controller mode the safety filter's Float64MultiArray goes here and the
# trajectory adapter turns it into JointTrajectory points for the controller.
ADAPTER_INPUT_TOPIC = "trajectory_adapter/commands"
# The demo's observation-fault injector: (node name, module, topic it republishes on).
FAULT_INJECTOR = ("fault_injector", "sim2real_ros.adapters.fault_node",
                  "fault_injector/joint_states")
# How restartable nodes are respawned, by `sim2real run` and by the launch file alike.
RESTART_LIMIT = 3
RESTART_DELAY_S = 0.5


@dataclass(frozen=True)
class GraphArgs:
    """The launch arguments of the graph (the same four for launch and `sim2real run`)."""

    backend: str = "sim"
    rollout_stage: str = "shadow"
    # "" = whatever the registry marks active; otherwise a version number.
    policy_version: str = ""
    # "" = none; a unit name under config/calibration/ or a path to a calibration file.
    calibration: str = ""


# Descriptions of the launch arguments; the launch file declares exactly these.
ARGUMENT_DESCRIPTIONS = {
    "backend": "Which arm drives the graph: 'sim' (the PyBullet sim bridge in real time) or "
    "'real' (a ros2_control controller manager, topics from config/backends/real.yaml).",
    "rollout_stage": "Rollout stage of the safety filter: shadow | advisory | limited | full "
    "(which source drives the arm).",
    "policy_version": "Policy version number to load from the registry; empty = the registry's "
    "active version.",
    "calibration": "Calibration of the unit: a name under config/calibration/ (with or without "
    ".yaml) or a path; empty = nominal simulator and no unit check.",
}
ARGUMENT_CHOICES: dict[str, tuple[str, ...] | None] = {
    "backend": BACKENDS,
    "rollout_stage": ROLLOUT_STAGES,
    "policy_version": None,
    "calibration": None,
}


@dataclass(frozen=True)
class NodeSpec:
    """One node of the graph as both launch and the runner need it."""

    name: str
    executable: str
    module: str
    package: str = PACKAGE
    parameter_files: tuple[str, ...] = ()
    # Applied after the files, in this order (the launch file passes them as one dict).
    parameters: tuple[tuple[str, Any], ...] = ()
    remappings: tuple[tuple[str, str], ...] = ()
    # A restartable node is respawned when it dies (launch: respawn=True); any other node
    # dying tears the whole graph down.
    restartable: bool = False
    role: str = "control"  # driver | control | monitor | adapter
    # CPU niceness (0..19) the node runs at: the arm-facing path (driver, safety filter,
    # baseline) keeps 0 so that a busy policy, a policy restart importing torch or an
    # observer can never starve it of CPU (launch: prefix "nice -n N").
    nice: int = 0

    def __post_init__(self) -> None:
        if not 0 <= int(self.nice) <= 19:
            raise ValueError(f"node {self.name}: nice = {self.nice}, expected 0..19")

    def parameter_dict(self) -> dict[str, Any]:
        """Return the parameter overrides as a dict."""
        return dict(self.parameters)

    def ros_args(self, override_file: str | Path | None = None) -> list[str]:
        """Return the `--ros-args ...` part of a command line that starts this node.

        Overrides go through a params file rather than `-p name:=value` so that strings with
        YAML-significant characters reach the node unchanged (launch_ros does the same).
        """
        out = ["--ros-args", "-r", f"__node:={self.name}"]
        for f in self.parameter_files:
            out += ["--params-file", str(f)]
        if override_file is not None:
            out += ["--params-file", str(override_file)]
        for src, dst in self.remappings:
            out += ["-r", f"{src}:={dst}"]
        return out

    def command(self, override_file: str | Path | None = None,
                python: str = sys.executable) -> list[str]:
        """Return the command line that starts this node as `python -m module --ros-args ...`."""
        return [python, "-m", self.module, *self.ros_args(override_file)]

    def override_params_yaml(self) -> str:
        """Return the overrides as a ROS 2 params file keyed by this node's name."""
        return yaml.safe_dump({self.name: {"ros__parameters": self.parameter_dict()}},
                              sort_keys=False)

    def is_available(self) -> bool:
        """Return whether this node's module exists in the installed package."""
        try:
            return importlib.util.find_spec(self.module) is not None
        except ModuleNotFoundError:
            return False


@dataclass(frozen=True)
class Backend:
    """What a backend file says: driver nodes to start, topic names the arm speaks."""

    name: str
    path: str
    driver_nodes: tuple[str, ...]
    command_interface: str
    topics: dict[str, str]
    use_sim_time: bool
    trajectory_time_from_start_s: float
    driver_parameters: dict[str, dict[str, Any]] = field(default_factory=dict)
    controller_manager: str = ""

    def remappings(self) -> tuple[tuple[str, str], ...]:
        """Return contract name -> backend name for every driver topic that differs."""
        return tuple(
            (DRIVER_TOPICS[key], self.topics[key])
            for key in DRIVER_TOPICS
            if self.topics[key] != DRIVER_TOPICS[key]
        )


@dataclass(frozen=True)
class Graph:
    """The nodes of the graph for one set of arguments."""

    args: GraphArgs
    backend: Backend
    nodes: tuple[NodeSpec, ...]
    # The calibration file the arguments name, resolved ("" = none). On the sim backend the sim
    # bridge loads it; on the real backend `unit_check` checks the live arm is its unit.
    calibration_path: str = ""

    def node(self, name: str) -> NodeSpec:
        """Return the node called `name`; KeyError names what exists."""
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(f"no node {name!r} in the graph (has {[n.name for n in self.nodes]})")

    def names(self) -> list[str]:
        """Return the node names in start order."""
        return [n.name for n in self.nodes]

    def missing(self) -> list[str]:
        """Return the nodes whose module is not installed."""
        return [n.name for n in self.nodes if not n.is_available()]

    def without(self, names: list[str] | tuple[str, ...]) -> Graph:
        """Return the graph with the named nodes left out."""
        return replace(self, nodes=tuple(n for n in self.nodes if n.name not in set(names)))

    def with_node(self, name: str, **changes: Any) -> Graph:
        """Return the graph with one node's fields replaced (e.g. restartable=True)."""
        self.node(name)
        return replace(
            self, nodes=tuple(replace(n, **changes) if n.name == name else n for n in self.nodes)
        )

    def with_parameters(self, name: str, **params: Any) -> Graph:
        """Return the graph with extra parameter overrides on one node (later wins)."""
        node = self.node(name)
        merged = {**node.parameter_dict(), **params}
        return self.with_node(name, parameters=tuple(merged.items()))

    def with_fault_injector(self, target: str) -> Graph:
        """Return the graph with `fault_injector` in front of `target`'s joint_states.

        For scripted fault injection only (the demo): the injector forwards the arm's
        joint_states to `target` and can glitch them on request, while every other node keeps
        hearing the arm directly.
        """
        node = self.node(target)
        files = node_params_file(FAULT_INJECTOR[0])
        injector = NodeSpec(
            name=FAULT_INJECTOR[0], executable=FAULT_INJECTOR[0], module=FAULT_INJECTOR[1],
            parameter_files=(str(files),) if files.is_file() else (),
            parameters=(("use_sim_time", self.backend.use_sim_time),),
            remappings=tuple((s, d) for s, d in node.remappings
                             if s == DRIVER_TOPICS["joint_states"]),
            restartable=False, role="adapter", nice=node.nice)
        # The first matching remap rule wins, so the contract name is replaced, not appended.
        remaps = [(s, d) for s, d in node.remappings if s != DRIVER_TOPICS["joint_states"]]
        remaps.insert(0, (DRIVER_TOPICS["joint_states"], FAULT_INJECTOR[2]))
        nodes: list[NodeSpec] = []
        for n in self.nodes:
            if n.name == target:
                nodes.append(injector)
                nodes.append(replace(n, remappings=tuple(remaps)))
            else:
                nodes.append(n)
        return replace(self, nodes=tuple(nodes))

    def describe(self) -> dict[str, Any]:
        """Return a plain, comparable description (what launch and runner must agree on)."""
        return {
            "args": vars(self.args).copy(),
            "backend": self.backend.name,
            "nodes": [
                {
                    "name": n.name,
                    "package": n.package,
                    "executable": n.executable,
                    "module": n.module,
                    "parameter_files": list(n.parameter_files),
                    "parameters": n.parameter_dict(),
                    "remappings": [list(r) for r in n.remappings],
                    "restartable": n.restartable,
                    "role": n.role,
                    "nice": n.nice,
                }
                for n in self.nodes
            ],
        }


@dataclass(frozen=True)
class _NodeEntry:
    """A node that may be in the graph: who it is and how the arguments reach it."""

    name: str
    executable: str
    module: str
    role: str
    restartable: bool
    nice: int = 0


# Niceness of the policy side and of observers (see NodeSpec.nice). Under CPU contention a nice-5
# process gets about a third of the share of a nice-0 one, a nice-10 one about a tenth.
POLICY_NICE = 5
MONITOR_NICE = 10

# Start order: the driver first (others wait for joint_states anyway), then the safety filter
# (deployed before the policy), the fallback, the policy and the observers.
NODE_TABLE: tuple[_NodeEntry, ...] = (
    _NodeEntry("sim_bridge", "sim_bridge", "sim2real_ros.sim.node", "driver", False),
    _NodeEntry("safety_filter", "safety_filter", "sim2real_ros.safety.node", "control", False),
    _NodeEntry("baseline_controller", "baseline_controller", "sim2real_ros.safety.baseline_node",
               "control", False),
    # The safety filter falls back to the baseline when the policy stream stops, so a dead
    # policy is survivable and it may be respawned; the safety filter, the baseline and the
    # driver are not.
    _NodeEntry("policy_node", "policy_node", "sim2real_ros.policy.node", "control", True,
               POLICY_NICE),
    _NodeEntry("task_sequencer", "task_sequencer", "sim2real_ros.policy.task_node", "control",
               False, POLICY_NICE),
    _NodeEntry("shadow_comparator", "shadow_comparator", "sim2real_ros.shadow.node", "monitor",
               True, MONITOR_NICE),
    _NodeEntry("trajectory_adapter", "trajectory_adapter",
               "sim2real_ros.adapters.trajectory_node", "adapter", False),
    # Real backend with a calibration only: is the live arm the calibrated unit?
    _NodeEntry("unit_check", "unit_check", "sim2real_ros.adapters.unit_node", "monitor", True,
               MONITOR_NICE),
)
DRIVER_NODE_NAMES = ("sim_bridge",)

# Which node parameter each launch argument sets (only when the argument is not empty).
ROLLOUT_STAGE_PARAM = ("safety_filter", "rollout_stage")
POLICY_VERSION_PARAM = ("policy_node", "policy_version")
CALIBRATION_PARAM_SIM = ("sim_bridge", "calibration_file")


def backend_file(backend: str) -> Path:
    """Return the shipped backend file for `backend`."""
    return share_path("config", "backends", f"{backend}.yaml")


def node_params_file(name: str) -> Path:
    """Return the shipped params file of node `name` (config/nodes/<name>.yaml)."""
    return share_path("config", "nodes", f"{name}.yaml")


def load_backend(path: str | Path) -> Backend:
    """Read and validate a backend file; ConfigError names the file, key and what is allowed."""
    p = Path(path)
    data = load_yaml(p)
    name = data.get("backend")
    if name not in BACKENDS:
        raise ConfigError(p, "backend", name, f"one of {list(BACKENDS)}")
    drivers = data.get("driver_nodes", [])
    if not isinstance(drivers, list) or any(d not in DRIVER_NODE_NAMES for d in drivers):
        raise ConfigError(p, "driver_nodes", drivers,
                          f"a list drawn from {list(DRIVER_NODE_NAMES)}")
    iface = data.get("command_interface", "forward_position_controller")
    if iface not in COMMAND_INTERFACES:
        raise ConfigError(p, "command_interface", iface, f"one of {list(COMMAND_INTERFACES)}")
    if iface == "joint_trajectory_controller" and drivers:
        # The sim bridge speaks forward_position_controller only; a trajectory route needs a
        # controller manager on the other side.
        raise ConfigError(p, "command_interface", iface,
                          "'forward_position_controller' when driver_nodes are started")
    topics_in = data.get("topics", {})
    if not isinstance(topics_in, dict):
        raise ConfigError(p, "topics", topics_in, "a mapping of topic keys to names")
    unknown = sorted(set(topics_in) - set(DRIVER_TOPICS))
    if unknown:
        raise ConfigError(p, f"topics.{unknown[0]}", topics_in[unknown[0]],
                          f"a key among {sorted(DRIVER_TOPICS)}")
    topics = dict(DRIVER_TOPICS)
    for key, value in topics_in.items():
        if not isinstance(value, str) or not value or value.endswith("/") or " " in value:
            raise ConfigError(p, f"topics.{key}", value, "a non-empty ROS topic name")
        topics[key] = value
    use_sim_time = data.get("use_sim_time", False)
    if not isinstance(use_sim_time, bool):
        raise ConfigError(p, "use_sim_time", use_sim_time, "true or false")
    traj = data.get("trajectory", {}) or {}
    tfs = traj.get("time_from_start_s", 0.02) if isinstance(traj, dict) else traj
    if isinstance(tfs, bool) or not isinstance(tfs, (int, float)) or not 0.0 < tfs <= 1.0:
        raise ConfigError(p, "trajectory.time_from_start_s", tfs, "a number in (0, 1] s")
    driver_params = data.get("driver_parameters", {}) or {}
    if not isinstance(driver_params, dict) or any(
        k not in drivers or not isinstance(v, dict) for k, v in driver_params.items()
    ):
        raise ConfigError(p, "driver_parameters", driver_params,
                          f"a mapping from a node of driver_nodes {drivers} to parameters")
    cm = data.get("controller_manager", "")
    if not isinstance(cm, str):
        raise ConfigError(p, "controller_manager", cm, "a node name such as /controller_manager")
    return Backend(
        name=name,
        path=str(p),
        driver_nodes=tuple(drivers),
        command_interface=iface,
        topics=topics,
        use_sim_time=use_sim_time,
        trajectory_time_from_start_s=float(tfs),
        driver_parameters={k: dict(v) for k, v in driver_params.items()},
        controller_manager=cm,
    )


def resolve_calibration(value: str) -> str:
    """Return the absolute path of a calibration given by unit name or path ("" stays "")."""
    if not value:
        return ""
    p = Path(value).expanduser()
    if p.is_file():
        return str(p.resolve())
    cal_dir = share_path("config", "calibration")
    for candidate in (cal_dir / value, cal_dir / f"{value}.yaml"):
        if candidate.is_file():
            return str(candidate.resolve())
    known = sorted(f.stem for f in cal_dir.glob("*.yaml")) if cal_dir.is_dir() else []
    raise ConfigError("<launch argument>", "calibration", value,
                      f"an existing file or a unit under {cal_dir} (known: {known})")


def check_args(args: GraphArgs) -> None:
    """Raise ConfigError for an argument outside its allowed values."""
    for key, choices in ARGUMENT_CHOICES.items():
        value = getattr(args, key)
        if choices is not None and value not in choices:
            raise ConfigError("<launch argument>", key, value, f"one of {list(choices)}")
    if args.policy_version and not (args.policy_version.isdigit()
                                    and int(args.policy_version) >= 1):
        raise ConfigError("<launch argument>", "policy_version", args.policy_version,
                          "empty (the registry's active version) or an integer >= 1")


def build_graph(args: GraphArgs = GraphArgs(), backend_path: str | Path | None = None) -> Graph:
    """Return the graph for `args`; `backend_path` replaces config/backends/<backend>.yaml."""
    check_args(args)
    backend = load_backend(backend_path or backend_file(args.backend))
    if backend.name != args.backend:
        raise ConfigError(backend.path, "backend", backend.name,
                          f"'{args.backend}' (the backend argument)")
    calibration = resolve_calibration(args.calibration)
    driver_remaps = backend.remappings()
    nodes: list[NodeSpec] = []
    for entry in NODE_TABLE:
        if entry.role == "driver" and entry.name not in backend.driver_nodes:
            continue
        if entry.role == "adapter" and backend.command_interface != "joint_trajectory_controller":
            continue
        if entry.name == "unit_check" and not (calibration and not backend.driver_nodes):
            continue
        params: dict[str, Any] = {"use_sim_time": backend.use_sim_time}
        remaps = list(driver_remaps)
        if entry.role == "driver":
            params.update(backend.driver_parameters.get(entry.name, {}))
            if calibration and (entry.name, "calibration_file") == CALIBRATION_PARAM_SIM:
                params["calibration_file"] = calibration
        if backend.command_interface == "joint_trajectory_controller":
            # The safety filter's Float64MultiArray goes to the adapter instead of the arm, and
            # every node that listens to the arm command (recorders, probes) follows it there;
            # the adapter, which subscribes the contract's command topic like the arm would,
            # is the only node that talks to the trajectory controller.
            remaps = [(s, d) for s, d in remaps if s != DRIVER_TOPICS["position_command"]]
            remaps.append((DRIVER_TOPICS["position_command"], ADAPTER_INPUT_TOPIC))
            if entry.role == "adapter":
                params["time_from_start_s"] = backend.trajectory_time_from_start_s
        if entry.name == "unit_check":
            params["calibration_file"] = calibration
        if entry.name == ROLLOUT_STAGE_PARAM[0]:
            params[ROLLOUT_STAGE_PARAM[1]] = args.rollout_stage
        if entry.name == POLICY_VERSION_PARAM[0] and args.policy_version:
            params[POLICY_VERSION_PARAM[1]] = int(args.policy_version)
        files = node_params_file(entry.name)
        nodes.append(NodeSpec(
            name=entry.name,
            executable=entry.executable,
            module=entry.module,
            parameter_files=(str(files),) if files.is_file() else (),
            parameters=tuple(params.items()),
            remappings=tuple(remaps),
            restartable=entry.restartable,
            role=entry.role,
            nice=entry.nice,
        ))
    return Graph(args=args, backend=backend, nodes=tuple(nodes), calibration_path=calibration)


def combined_params(graph: Graph) -> dict[str, Any]:
    """Return the params files merged into one ROS 2 params mapping.

    The graph's nodes come first, in start order; then every other config/nodes/*.yaml
    (nodes of other graphs: sysid_recorder, the proxy_arm stand-in), by name.
    """
    files = [f for node in graph.nodes for f in node.parameter_files]
    nodes_dir = share_path("config", "nodes")
    seen = {Path(f).resolve() for f in files}
    files += [str(f) for f in sorted(nodes_dir.glob("*.yaml")) if f.resolve() not in seen]
    out: dict[str, Any] = {}
    for f in files:
        data = load_yaml(f)
        for key, section in data.items():
            out.setdefault(key, {"ros__parameters": {}})
            out[key]["ros__parameters"].update((section or {}).get("ros__parameters", {}))
    return out


def combined_params_text(graph: Graph) -> str:
    """Return config/sim2real.yaml's content: config/nodes/*.yaml merged."""
    header = (
        "# GENERATED from config/nodes/*.yaml by `python -m sim2real_ros.graph --write-params`;\n"
        "# do not edit here. One file per node stays the source of truth (each room owns its\n"
        "# node's file); this merged copy is for tools that take a single params file\n"
        "# (`ros2 run ... --ros-args --params-file config/sim2real.yaml`).\n"
    )
    return header + yaml.safe_dump(combined_params(graph), sort_keys=False)


def main(argv: list[str] | None = None) -> int:
    """Print the graph for a backend, or write config/sim2real.yaml."""
    parser = argparse.ArgumentParser(prog="python -m sim2real_ros.graph", description=main.__doc__)
    parser.add_argument("--backend", default="sim", choices=BACKENDS)
    parser.add_argument("--write-params", action="store_true",
                        help="write config/sim2real.yaml from config/nodes/*.yaml")
    ns = parser.parse_args(argv)
    graph = build_graph(GraphArgs(backend=ns.backend))
    if ns.write_params:
        target = share_path("config", "sim2real.yaml")
        full = _all_nodes_graph()
        target.write_text(combined_params_text(full))
        print(f"wrote {target}")
        return 0
    print(yaml.safe_dump(graph.describe(), sort_keys=False))
    return 0


def _all_nodes_graph() -> Graph:
    """Return the sim graph plus the nodes only the real backend starts (for the merged file)."""
    sim = build_graph(GraphArgs(backend="sim"))
    names = set(sim.names())
    extra = tuple(
        NodeSpec(name=e.name, executable=e.executable, module=e.module,
                 parameter_files=(str(node_params_file(e.name)),)
                 if node_params_file(e.name).is_file() else (), role=e.role, nice=e.nice)
        for e in NODE_TABLE if e.name not in names
    )
    return replace(sim, nodes=sim.nodes + extra).with_fault_injector("policy_node")


if __name__ == "__main__":
    sys.exit(main())
