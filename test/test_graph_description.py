"""graph.py: one description per backend; backends differ only in driver and topic names."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sim2real_ros.config import ConfigError
from sim2real_ros.graph import (
    ADAPTER_INPUT_TOPIC,
    DRIVER_TOPICS,
    GraphArgs,
    backend_file,
    build_graph,
    combined_params_text,
    _all_nodes_graph,
)
from sim2real_ros.paths import share_path


def _real_with(tmp_path: Path, **changes: object) -> Path:
    data = yaml.safe_load(backend_file("real").read_text())
    data.update(changes)
    p = tmp_path / "backend.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_sim_backend_starts_the_sim_bridge_and_remaps_nothing() -> None:
    g = build_graph(GraphArgs(backend="sim"))
    assert g.names()[0] == "sim_bridge"
    assert {"safety_filter", "baseline_controller", "policy_node", "task_sequencer",
            "shadow_comparator"} <= set(g.names())
    assert "trajectory_adapter" not in g.names()
    assert all(n.remappings == () for n in g.nodes)
    assert g.node("sim_bridge").parameter_dict()["clock_mode"] == "realtime"
    assert all(n.parameter_dict()["use_sim_time"] is False for n in g.nodes)


def test_real_backend_drops_the_sim_bridge_and_points_the_arm_topics_at_ros2_control() -> None:
    sim = build_graph(GraphArgs(backend="sim"))
    real = build_graph(GraphArgs(backend="real"))
    assert real.names() == [n for n in sim.names() if n != "sim_bridge"]
    expected = {
        "joint_states": "/joint_states",
        "force_torque_sensor_broadcaster/wrench": "/force_torque_sensor_broadcaster/wrench",
        "forward_position_controller/commands": "/forward_position_controller/commands",
    }
    for node in real.nodes:
        assert expected.items() <= dict(node.remappings).items()
        # Nothing else differs between the backends for the nodes both run.
        s = sim.node(node.name)
        assert (node.module, node.parameter_files, node.parameters, node.restartable) == (
            s.module, s.parameter_files, s.parameters, s.restartable)


def test_trajectory_controller_backend_adds_the_adapter_in_front_of_the_controller(
    tmp_path: Path,
) -> None:
    path = _real_with(tmp_path, command_interface="joint_trajectory_controller",
                      trajectory={"time_from_start_s": 0.05})
    g = build_graph(GraphArgs(backend="real"), backend_path=path)
    adapter = g.node("trajectory_adapter")
    assert adapter.parameter_dict()["time_from_start_s"] == 0.05
    remaps = dict(adapter.remappings)
    assert remaps[DRIVER_TOPICS["position_command"]] == ADAPTER_INPUT_TOPIC
    assert remaps[DRIVER_TOPICS["trajectory_command"]] == (
        "/joint_trajectory_controller/joint_trajectory")
    # The safety filter's output goes to the adapter, never to forward_position_controller.
    assert dict(g.node("safety_filter").remappings)[DRIVER_TOPICS["position_command"]] == (
        ADAPTER_INPUT_TOPIC)


def test_a_controller_manager_in_a_namespace_needs_only_the_backend_file(tmp_path: Path) -> None:
    topics = {k: f"/cell_a/{v}" for k, v in DRIVER_TOPICS.items()}
    g = build_graph(GraphArgs(backend="real"), backend_path=_real_with(tmp_path, topics=topics))
    assert dict(g.node("policy_node").remappings)["joint_states"] == "/cell_a/joint_states"


def test_launch_arguments_reach_the_nodes_that_own_them() -> None:
    g = build_graph(GraphArgs(backend="sim", rollout_stage="limited", policy_version="4"))
    assert g.node("safety_filter").parameter_dict()["rollout_stage"] == "limited"
    assert g.node("policy_node").parameter_dict()["policy_version"] == 4
    default = build_graph(GraphArgs())
    assert "policy_version" not in default.node("policy_node").parameter_dict()


@pytest.mark.parametrize("args, match", [
    (GraphArgs(backend="hardware"), r"backend = 'hardware': expected one of \['sim', 'real'\]"),
    (GraphArgs(rollout_stage="yolo"), r"rollout_stage = 'yolo'"),
    (GraphArgs(policy_version="latest"), r"policy_version = 'latest'.*integer >= 1"),
    (GraphArgs(calibration="arm-SN0000"), r"calibration = 'arm-SN0000'.*known:"),
])
def test_bad_arguments_are_refused_naming_the_argument(args: GraphArgs, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        build_graph(args)


@pytest.mark.parametrize("changes, key", [
    ({"backend": "simulation"}, "backend"),
    ({"command_interface": "effort_controller"}, "command_interface"),
    ({"driver_nodes": ["proxy_arm"]}, "driver_nodes"),
    ({"topics": {"joint_state": "/js"}}, "topics.joint_state"),
    ({"topics": {"joint_states": ""}}, "topics.joint_states"),
    ({"trajectory": {"time_from_start_s": 0}}, "trajectory.time_from_start_s"),
    ({"use_sim_time": "no"}, "use_sim_time"),
])
def test_each_bad_backend_file_key_is_named_in_the_error(
    tmp_path: Path, changes: dict[str, object], key: str
) -> None:
    path = _real_with(tmp_path, **changes)
    with pytest.raises(ConfigError) as exc:
        build_graph(GraphArgs(backend="real"), backend_path=path)
    assert exc.value.key == key and str(path) in str(exc.value)


def test_a_backend_file_for_the_other_backend_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="the backend argument"):
        build_graph(GraphArgs(backend="sim"), backend_path=backend_file("real"))


def test_sim_bridge_with_trajectory_controller_is_refused(tmp_path: Path) -> None:
    data = yaml.safe_load(backend_file("sim").read_text())
    data["command_interface"] = "joint_trajectory_controller"
    p = tmp_path / "sim.yaml"
    p.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="command_interface"):
        build_graph(GraphArgs(backend="sim"), backend_path=p)


def test_every_node_params_file_that_exists_is_used_and_keyed_by_its_node() -> None:
    g = _all_nodes_graph()
    for node in g.nodes:
        f = share_path("config", "nodes", f"{node.name}.yaml")
        if f.is_file():
            assert node.parameter_files == (str(f),)
            assert node.name in yaml.safe_load(f.read_text())


def test_combined_params_file_is_in_sync_with_the_per_node_files() -> None:
    shipped = share_path("config", "sim2real.yaml").read_text()
    assert shipped == combined_params_text(_all_nodes_graph()), (
        "config/sim2real.yaml is stale: run `python -m sim2real_ros.graph --write-params`")
