"""graph.py and launch/sim2real.launch.py describe the same nodes, parameters and remaps.

`launch` and `launch_ros` are not installable here: they are not published on PyPI (and no
other registry this project may use carries them), and the ROS 2 wheels we use do not include
them. So the test executes the real launch file's generate_launch_description() with minimal
recording stand-ins for exactly the names the launch file imports, injected into sys.modules,
and compares what it would launch with graph.py. The stand-ins only record constructor
arguments; the comparison is against graph.py, never against the stand-ins themselves.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from sim2real_ros.config import ConfigError
from sim2real_ros.graph import (
    ARGUMENT_DESCRIPTIONS,
    RESTART_DELAY_S,
    RESTART_LIMIT,
    GraphArgs,
    build_graph,
)

REPO = Path(__file__).resolve().parent.parent
LAUNCH_FILE = REPO / "launch" / "sim2real.launch.py"


class _Recorded:
    """Remembers its constructor arguments."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args
        self.kwargs = kwargs


class _LaunchConfiguration(_Recorded):
    def perform(self, context: Any) -> str:
        return context.launch_configurations[self.args[0]]


class _Context:
    def __init__(self, launch_configurations: dict[str, str]) -> None:
        self.launch_configurations = launch_configurations


def _stand_in_modules() -> dict[str, types.ModuleType]:
    mods = {name: types.ModuleType(name) for name in
            ("launch", "launch.actions", "launch.substitutions", "launch_ros",
             "launch_ros.actions")}
    mods["launch"].LaunchDescription = type("LaunchDescription", (_Recorded,), {})
    for cls in ("DeclareLaunchArgument", "OpaqueFunction", "Shutdown"):
        setattr(mods["launch.actions"], cls, type(cls, (_Recorded,), {}))
    mods["launch.substitutions"].LaunchConfiguration = _LaunchConfiguration
    mods["launch_ros.actions"].Node = type("Node", (_Recorded,), {})
    return mods


def load_launch_file(path: Path, monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """Import a launch file with the stand-ins in place."""
    for name, mod in _stand_in_modules().items():
        monkeypatch.setitem(sys.modules, name, mod)
    spec = importlib.util.spec_from_file_location(f"launchfile_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def launched_nodes(module: types.ModuleType, arguments: dict[str, str]) -> tuple[Any, list[Any]]:
    """Return (declared arguments, Node actions) for the given launch arguments."""
    desc = module.generate_launch_description()
    entities = desc.args[0]
    declared = [e for e in entities if type(e).__name__ == "DeclareLaunchArgument"]
    values = {d.args[0]: d.kwargs["default_value"] for d in declared}
    values.update(arguments)
    opaque = [e for e in entities if type(e).__name__ == "OpaqueFunction"]
    assert len(opaque) == 1
    nodes = opaque[0].kwargs["function"](_Context(values))
    return declared, nodes


def _node_view(node: Any) -> dict[str, Any]:
    kw = node.kwargs
    files = [p for p in kw["parameters"] if isinstance(p, str)]
    dicts = [p for p in kw["parameters"] if isinstance(p, dict)]
    overrides: dict[str, Any] = {}
    for d in dicts:
        overrides.update(d)
    return {
        "name": kw["name"],
        "package": kw["package"],
        "executable": kw["executable"],
        "parameter_files": files,
        "parameters": overrides,
        "remappings": [list(r) for r in kw["remappings"]],
        "restartable": bool(kw.get("respawn", False)),
        "nice": int(kw["prefix"].split()[-1]) if "prefix" in kw else 0,
    }


CASES = [
    {"backend": "sim"},
    {"backend": "real"},
    {"backend": "sim", "rollout_stage": "limited", "policy_version": "3"},
    {"backend": "real", "rollout_stage": "full", "policy_version": "12"},
]


@pytest.mark.parametrize("arguments", CASES, ids=lambda a: "-".join(a.values()))
def test_launch_file_starts_exactly_the_nodes_parameters_and_remaps_of_graph_py(
    arguments: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    module = load_launch_file(LAUNCH_FILE, monkeypatch)
    _, nodes = launched_nodes(module, arguments)
    graph = build_graph(GraphArgs(**{**vars(GraphArgs()), **arguments}))
    expected = [
        {k: n[k] for k in ("name", "package", "executable", "parameter_files", "parameters",
                           "remappings", "restartable", "nice")}
        for n in graph.describe()["nodes"]
    ]
    assert [_node_view(n) for n in nodes] == expected
    for node, spec in zip(nodes, graph.nodes):
        if spec.restartable:
            assert node.kwargs["respawn_delay"] == RESTART_DELAY_S
            assert node.kwargs["respawn_max_retries"] == RESTART_LIMIT
        else:
            # A node that is not restartable takes the launch down, as in `sim2real run`.
            assert type(node.kwargs["on_exit"]).__name__ == "Shutdown"


def test_launch_file_declares_every_graph_argument_with_a_description_and_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    module = load_launch_file(LAUNCH_FILE, monkeypatch)
    declared, _ = launched_nodes(module, {})
    by_name = {d.args[0]: d for d in declared}
    assert list(by_name) == list(vars(GraphArgs()))
    for name, d in by_name.items():
        assert d.kwargs["description"] == ARGUMENT_DESCRIPTIONS[name]
        assert len(d.kwargs["description"]) > 20
        assert d.kwargs["default_value"] == str(getattr(GraphArgs(), name))
    assert by_name["backend"].kwargs["choices"] == ["sim", "real"]


def test_launch_file_refuses_an_unknown_backend_like_graph_py(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    module = load_launch_file(LAUNCH_FILE, monkeypatch)
    with pytest.raises(ConfigError, match="backend = 'hardware'"):
        launched_nodes(module, {"backend": "hardware"})


SYSID_LAUNCH = REPO / "launch" / "sysid.launch.py"


@pytest.mark.parametrize("backend", ["sim", "real"])
def test_sysid_launch_file_follows_graph_py_for_the_nodes_it_shares(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sim2real_ros.sysid.graph import RECORDER, recorder_overrides, sysid_nodes

    module = load_launch_file(SYSID_LAUNCH, monkeypatch)
    declared, nodes = launched_nodes(module, {"unit": "arm-SN1234", "backend": backend})
    assert all(len(d.kwargs["description"]) > 10 for d in declared)
    values = {d.args[0]: d.kwargs["default_value"] for d in declared}
    values.update(unit="arm-SN1234", backend=backend)
    described = sysid_nodes("arm-SN1234", backend, "", recorder_overrides(values))
    assert [n.kwargs["name"] for n in nodes] == [d["name"] for d in described]
    for node, d in zip(nodes, described):
        assert node.kwargs["parameters"] == d["parameters"]
        assert [tuple(r) for r in node.kwargs["remappings"]] == [tuple(r) for r in d["remappings"]]
        # Any node exiting ends the run, as in sim2real.launch.py.
        assert type(node.kwargs["on_exit"]).__name__ == "Shutdown"
    main = build_graph(GraphArgs(backend=backend, rollout_stage="full"))
    for node in nodes:
        name = node.kwargs["name"]
        if name == RECORDER:
            # The recorder hears the arm under the same names as the rest of the graph.
            assert node.kwargs["remappings"] == list(main.node("safety_filter").remappings)
            continue
        spec = main.node(name)
        assert (node.kwargs["package"], node.kwargs["executable"]) == (spec.package,
                                                                      spec.executable)
        files = [p for p in node.kwargs["parameters"] if isinstance(p, str)]
        assert files == list(spec.parameter_files)
        assert list(node.kwargs["remappings"]) == list(spec.remappings)
        overrides = node.kwargs["parameters"][-1]
        expected = spec.parameter_dict()
        if name == "safety_filter":
            expected["require_confidence"] = False  # the excitation carries no confidence
        assert overrides == expected
    assert ("sim_bridge" in [n.kwargs["name"] for n in nodes]) == (backend == "sim")
