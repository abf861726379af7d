"""How much of the host other work took while the real-time graph ran (Linux /proc).

The proxy evaluations run a real-time graph: the proxy arm, the safety filter, the policy and
the driver each keep a period. Work that shares the cores costs the graph its period, even when
niced. Run 19 of the transfer experiment showed this: the same code on a busy host had 3488
interventions on its randomized step instead of 0, and reached 88 % instead of 97 %. So every
proxy evaluation records the CPU used outside the experiment's own process tree, and the report
flags a step whose host was busy. A result from a busy host is not comparable with one from an
idle host.

Busy time comes from /proc/stat (user, nice, system, irq, softirq, steal). The tree's own time
is utime + stime + cutime + cstime of the root and its live descendants, from
/proc/<pid>/stat. cutime and cstime hold the children that already exited and were reaped.
The difference is the other work. No rclpy here.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

PROC = Path("/proc")
# Other work above this many cores, averaged over an evaluation, marks the step's host as busy.
BUSY_FOREIGN_CORES = 0.25


def _ticks() -> float:
    return float(os.sysconf("SC_CLK_TCK"))


def host_busy_s(proc: Path = PROC) -> float:
    """CPU seconds all cores have been busy since boot (the first line of /proc/stat)."""
    fields = (proc / "stat").read_text().splitlines()[0].split()
    if fields[0] != "cpu":
        raise ValueError(f"{proc / 'stat'}: expected the 'cpu' line first, got {fields[0]!r}")
    v = [float(x) for x in fields[1:]]
    # user nice system idle iowait irq softirq steal [guest guest_nice: already in user/nice]
    busy = v[0] + v[1] + v[2] + v[5] + v[6] + (v[7] if len(v) > 7 else 0.0)
    return busy / _ticks()


def _stat(pid: int, proc: Path) -> tuple[int, float] | None:
    """(ppid, utime + stime + cutime + cstime in s) of one process, or None if it is gone."""
    try:
        raw = (proc / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after it.
    rest = raw[raw.rindex(")") + 2:].split()
    ppid = int(rest[1])
    cpu = sum(float(x) for x in rest[11:15])  # fields 14-17: utime stime cutime cstime
    return ppid, cpu / _ticks()


def tree_cpu_s(root_pid: int, proc: Path = PROC) -> float:
    """CPU seconds used by `root_pid` and its live descendants (with their reaped children)."""
    stats: dict[int, tuple[int, float]] = {}
    for entry in proc.iterdir():
        if entry.name.isdigit():
            s = _stat(int(entry.name), proc)
            if s is not None:
                stats[int(entry.name)] = s
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    total, todo, seen = 0.0, [root_pid], set()
    while todo:
        pid = todo.pop()
        if pid in seen or pid not in stats:
            continue
        seen.add(pid)
        total += stats[pid][1]
        todo.extend(children.get(pid, []))
    return total


@dataclass
class HostLoad:
    """CPU use over one measured interval."""

    wall_s: float
    cpus: int
    host_busy_cores: float  # all work, averaged over the interval
    own_cores: float  # the experiment's process tree (the graph included)
    foreign_cores: float  # everything else: what the graph had to share its cores with
    busy: bool  # foreign_cores > BUSY_FOREIGN_CORES

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        return asdict(self)


class HostLoadMeter:
    """Measure the host's CPU use outside a process tree between start() and stop()."""

    def __init__(self, root_pid: int | None = None, proc: Path = PROC) -> None:
        self.root_pid = os.getpid() if root_pid is None else root_pid
        self.proc = proc
        self._t0: float | None = None
        self._busy0 = 0.0
        self._own0 = 0.0

    def start(self) -> HostLoadMeter:
        """Begin an interval."""
        self._t0 = time.monotonic()
        self._busy0 = host_busy_s(self.proc)
        self._own0 = tree_cpu_s(self.root_pid, self.proc)
        return self

    def stop(self) -> HostLoad:
        """End the interval and return what it measured."""
        if self._t0 is None:
            raise RuntimeError("HostLoadMeter.stop() before start()")
        wall = max(time.monotonic() - self._t0, 1e-6)
        busy = (host_busy_s(self.proc) - self._busy0) / wall
        own = (tree_cpu_s(self.root_pid, self.proc) - self._own0) / wall
        # A descendant that leaves the tree (its parent exited first and it was re-parented)
        # takes its time out of `own`, so it shows as foreign: the meter can over-report
        # other work, but it cannot hide it.
        foreign = max(busy - own, 0.0)
        self._t0 = None
        return HostLoad(wall_s=wall, cpus=os.cpu_count() or 1, host_busy_cores=busy,
                        own_cores=own, foreign_cores=foreign,
                        busy=foreign > BUSY_FOREIGN_CORES)
