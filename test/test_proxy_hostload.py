"""The host-load meter the transfer experiment records with every proxy evaluation.

Parsing is checked on a /proc tree written here (exact figures). The accounting is then
checked on the real /proc with real busy processes: one inside the measured tree and one
outside it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sim2real_ros.proxy import hostload
from sim2real_ros.proxy.hostload import HostLoadMeter, host_busy_s, tree_cpu_s
from sim2real_ros.proxy.report import Row, host_line

TCK = os.sysconf("SC_CLK_TCK")
BUSY = [sys.executable, "-c", "import time\nt = time.process_time()\n"
        "while time.process_time() - t < 1.5: pass"]


def _proc_stat(pid: int, ppid: int, name: str, ticks: tuple[int, int, int, int]) -> str:
    # pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
    # utime stime cutime cstime ...
    u, s, cu, cs = ticks
    return f"{pid} ({name}) S {ppid} 1 1 0 -1 0 0 0 0 0 {u} {s} {cu} {cs} 20 0 1 0\n"


@pytest.fixture()
def fake_proc(tmp_path: Path) -> Path:
    (tmp_path / "stat").write_text(
        "cpu  100 20 30 5000 7 4 6 2 0 0\ncpu0 50 10 15 2500 3 2 3 1 0 0\n")
    procs = {
        10: (1, "experiment", (100, 20, 30, 0)),
        11: (10, "proxy arm (mujoco)", (200, 10, 0, 0)),  # spaces and parentheses in comm
        12: (11, "a)b", (5, 5, 0, 0)),
        20: (1, "other", (999, 999, 0, 0)),  # not in the tree
    }
    for pid, (ppid, name, ticks) in procs.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(_proc_stat(pid, ppid, name, ticks))
    (tmp_path / "self").mkdir()  # not a pid directory: ignored
    return tmp_path


def test_host_busy_counts_user_nice_system_irq_softirq_steal(fake_proc: Path) -> None:
    # idle (5000) and iowait (7) are not busy; guest columns are already in user
    assert host_busy_s(fake_proc) == pytest.approx((100 + 20 + 30 + 4 + 6 + 2) / TCK)


def test_tree_cpu_sums_the_root_and_its_descendants_only(fake_proc: Path) -> None:
    assert tree_cpu_s(10, fake_proc) == pytest.approx((150 + 210 + 10) / TCK)
    assert tree_cpu_s(11, fake_proc) == pytest.approx((210 + 10) / TCK)
    assert tree_cpu_s(20, fake_proc) == pytest.approx(1998 / TCK)
    assert tree_cpu_s(99, fake_proc) == 0.0  # a process that is gone


def test_a_malformed_proc_stat_is_refused(tmp_path: Path) -> None:
    (tmp_path / "stat").write_text("intr 1 2 3\n")
    with pytest.raises(ValueError, match="expected the 'cpu' line"):
        host_busy_s(tmp_path)


def test_stop_before_start_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="before start"):
        HostLoadMeter().stop()


def test_work_outside_the_tree_is_foreign() -> None:
    root = subprocess.Popen(["sleep", "30"])
    try:
        meter = HostLoadMeter(root.pid).start()
        subprocess.run(BUSY, check=True)  # our child, not the sleeping root's
        load = meter.stop()
    finally:
        root.kill()
        root.wait()
    assert load.own_cores < 0.05
    assert load.foreign_cores > 0.5, load
    assert load.busy
    assert load.cpus == os.cpu_count()


def test_work_inside_the_tree_is_own() -> None:
    meter = HostLoadMeter().start()
    child = subprocess.Popen(BUSY)  # a descendant of this process
    child.wait()  # reaped: its time moves into this process's cutime
    load = meter.stop()
    assert load.own_cores * load.wall_s > 1.2, load  # the child's 1.5 s CPU, tick-rounded
    assert load.host_busy_cores >= load.own_cores - 0.05


def _row(policy: str, foreign: float | None) -> Row:
    return Row(label=policy, step="1-2", policy=policy, sim_success=1.0, proxy_success=1.0,
               tracking_rms_mrad=1.0, final_error_mm=1.0, interventions=0, fallbacks=0,
               policy_drove=1.0, audit=None, sim_episodes=60, proxy_episodes=60,
               host_foreign_cores=foreign, host_cpus=2)


def test_report_marks_a_busy_step() -> None:
    line = host_line([_row("nominal", 0.02), _row("randomized", 0.9)])
    assert "nominal 0.02," in line and "randomized 0.90 (**busy**)" in line
    assert "not comparable" in line and "(of 2)" in line
    idle = host_line([_row("nominal", 0.02), _row("randomized", hostload.BUSY_FOREIGN_CORES)])
    assert "**busy**" not in idle and "idle host" in idle
    assert host_line([_row("nominal", None)]) == ""  # a run folder from before the meter
