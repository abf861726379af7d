"""The robot-cell install path: `colcon build` treats us as ament_python and installs our files."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
COLCON = Path(sys.executable).parent / "colcon"


@pytest.mark.slow
def test_colcon_builds_an_ament_python_package_with_shared_files(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "sim2real_ros").symlink_to(REPO)
    env = dict(os.environ)
    env["PATH"] = f"{COLCON.parent}:{env['PATH']}"
    listing = subprocess.run([str(COLCON), "list"], cwd=ws, env=env, capture_output=True,
                             text=True, check=True).stdout
    # A package.xml that catkin_pkg rejects silently demotes the package to plain `python`.
    assert "(ros.ament_python)" in listing, listing
    build = subprocess.run(
        [str(COLCON), "build", "--build-base", str(tmp_path / "build"),
         "--install-base", str(ws / "install")],
        cwd=ws, env=env, capture_output=True, text=True,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    share = ws / "install" / "sim2real_ros" / "share" / "sim2real_ros"
    assert (share / "urdf" / "sim2real_arm.urdf").is_file()
    assert (share / "package.xml").is_file()
    for sub in ("config", "launch"):
        src_files = sorted(p.relative_to(REPO) for p in (REPO / sub).rglob("*") if p.is_file())
        got = sorted(p.relative_to(share) for p in (share / sub).rglob("*") if p.is_file())
        assert got == src_files, f"{sub}/ not installed completely"
    lib = ws / "install" / "sim2real_ros" / "lib" / "sim2real_ros"
    for exe in ("sim_bridge", "safety_filter", "policy_node", "sim2real"):
        assert (lib / exe).is_file(), f"{exe} not installed where `ros2 run` looks"
    # After sourcing, the installed package finds its share directory through the ament index.
    probe = subprocess.run(
        ["bash", "-c", f"source {ws}/install/setup.bash && cd / && {sys.executable} -c "
         "'import sim2real_ros.paths as p; print(p.__file__); print(p.share_dir())'"],
        env=env, capture_output=True, text=True,
    )
    assert probe.returncode == 0, probe.stderr
    module_file, share_dir = probe.stdout.split()
    assert module_file.startswith(str(ws / "install")), module_file
    assert Path(share_dir) == share
