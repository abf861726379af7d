"""ament_python package: installs the sim2real_ros library, its nodes and its shared files."""

from __future__ import annotations

from glob import glob
from pathlib import Path

from setuptools import Extension, find_packages, setup

PACKAGE = "sim2real_ros"


def tree(folder: str) -> list[tuple[str, list[str]]]:
    """List (install dir, files) pairs so config/ keeps its sub-folders under share/."""
    out: dict[str, list[str]] = {}
    for f in sorted(glob(f"{folder}/**/*", recursive=True)):
        if Path(f).is_file():
            out.setdefault(str(Path("share", PACKAGE, Path(f).parent)), []).append(f)
    return sorted(out.items())


# Compiled hot paths (plain C on the CPython API, no third-party build tools). Each has a pure
# Python reference implementation that it is tested against bit for bit (hence no FMA
# contraction), and the package falls back to it when the extension is absent, so `optional`
# lets a machine without a C compiler still install.
NATIVE = [
    ("sim2real_ros.sim._servo", "sim2real_ros/sim/_servo.c"),
    ("sim2real_ros.safety._projection", "sim2real_ros/safety/_projection.c"),
]
EXT_MODULES = [
    Extension(
        name, [src], extra_compile_args=["-O2", "-std=c11", "-ffp-contract=off"], optional=True
    )
    for name, src in NATIVE
    if Path(src).is_file()
]


setup(
    name=PACKAGE,
    version="0.1.0",
    packages=find_packages(exclude=["test", "test.*", "bench"]),
    package_data={PACKAGE: ["py.typed", "policy/default/*"]},
    data_files=[
        ("share/ament_index/resource_index/packages", [f"resource/{PACKAGE}"]),
        (f"share/{PACKAGE}", ["package.xml"]),
        *tree("launch"),
        *tree("config"),
        *tree("urdf"),
    ],
    ext_modules=EXT_MODULES,
    install_requires=["setuptools"],
    zip_safe=False,
    maintainer="sim2real_ros maintainers",
    maintainer_email="maintainers@sim2real-ros.org",
    description="Randomized simulation, calibration, guarded policy deployment, shadow mode, rollback.",
    license="Apache-2.0",
    entry_points={
        "console_scripts": [
            "sim2real = sim2real_ros.cli:main",
            "sim_bridge = sim2real_ros.sim.node:main",
            "safety_filter = sim2real_ros.safety.node:main",
            "baseline_controller = sim2real_ros.safety.baseline_node:main",
            "policy_node = sim2real_ros.policy.node:main",
            "sysid_recorder = sim2real_ros.sysid.node:main",
            "shadow_comparator = sim2real_ros.shadow.node:main",
            "task_sequencer = sim2real_ros.policy.task_node:main",
            "proxy_arm = sim2real_ros.proxy.node:main",
            "trajectory_adapter = sim2real_ros.adapters.trajectory_node:main",
            "fault_injector = sim2real_ros.adapters.fault_node:main",
            "unit_check = sim2real_ros.adapters.unit_node:main",
        ],
    },
)
