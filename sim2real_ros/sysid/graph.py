"""The sysid graph as plain data: arm (or sim bridge), safety filter in stage `full`, recorder.

`launch/sysid.launch.py` turns these dicts into launch_ros Nodes; tests and `sim2real` use them
directly. Built on sim2real_ros.graph (one description of the main graph): the driver, the
trajectory adapter where the backend needs it, the safety filter and its independent fallback
are kept; the policy, the task sequencer and the shadow comparator are left out, and the
recorder is added. The safety filter runs in stage `full` without requiring policy confidence,
because the excitation arrives on `policy/joint_command` with no confidence stream.
"""

from __future__ import annotations

from typing import Any

from sim2real_ros.graph import GraphArgs, build_graph, node_params_file

RECORDER = "sysid_recorder"
KEPT_NODES = ("sim_bridge", "trajectory_adapter", "safety_filter", "baseline_controller")
LAUNCH_ARGUMENTS = {
    "unit": "Serial of the arm being identified (stored in the bag; required).",
    "backend": "sim (PyBullet sim bridge) or real (the cell's ros2_control driver).",
    "calibration": "Calibration for the sim backend (unit name or path); empty = nominal.",
    "excitation": "multisine | chirp | step | none (record only).",
    "duration_s": "Excitation length, s.",
    "amplitude_rad": "Peak offset per joint before the envelope scales it, rad.",
    "output_dir": "Directory for the bag.",
    "cell": "Cell name stored in the bag.",
    "tool": "Tool name stored in the bag.",
    "note": "Operator note stored in the bag.",
}
LAUNCH_DEFAULTS = {"unit": "", "backend": "sim", "calibration": "", "excitation": "multisine",
                   "duration_s": "20.0", "amplitude_rad": "0.3", "output_dir": "bags",
                   "cell": "", "tool": "", "note": ""}


def sysid_nodes(
    unit: str,
    backend: str = "sim",
    calibration: str = "",
    recorder_params: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Return the nodes of the sysid graph as {package, executable, name, parameters, remappings}.

    `parameters` is a list: the node's params files, then one dict of overrides (launch_ros
    order). Raises ConfigError for an unknown backend or calibration (from graph.py).
    """
    if not unit.strip():
        raise ValueError("unit must name the arm being identified (its serial)")
    graph = build_graph(GraphArgs(backend=backend, rollout_stage="full",
                                  calibration=calibration))
    out: list[dict[str, Any]] = []
    use_sim_time = graph.backend.use_sim_time
    driver_remaps: list[tuple[str, str]] = []
    for spec in graph.nodes:
        if spec.name not in KEPT_NODES:
            continue
        params = spec.parameter_dict()
        if spec.name == "safety_filter":
            params["require_confidence"] = False
        driver_remaps = list(spec.remappings)
        out.append({
            "package": spec.package,
            "executable": spec.executable,
            "name": spec.name,
            "module": spec.module,
            "parameters": [*spec.parameter_files, params],
            "remappings": list(spec.remappings),
        })
    files = node_params_file(RECORDER)
    rec: dict[str, Any] = {"use_sim_time": use_sim_time, "unit_serial": unit}
    rec.update(recorder_params or {})
    out.append({
        "package": "sim2real_ros",
        "executable": RECORDER,
        "name": RECORDER,
        "module": "sim2real_ros.sysid.node",
        # the recorder hears the arm under the same names the rest of the graph does
        "parameters": [*([str(files)] if files.is_file() else []), rec],
        "remappings": driver_remaps,
    })
    return out


def recorder_overrides(values: dict[str, str]) -> dict[str, Any]:
    """Turn launch-argument strings into recorder parameter overrides."""
    return {
        "excitation": values["excitation"],
        "duration_s": float(values["duration_s"]),
        "amplitude_rad": float(values["amplitude_rad"]),
        "output_dir": values["output_dir"],
        "unit_cell": values["cell"],
        "unit_tool": values["tool"],
        "operator_note": values["note"],
    }
