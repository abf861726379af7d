"""Start the graph of graph.py as processes where `ros2 launch` is absent (`sim2real run`).

Each node is `python -m <module> --ros-args ...` with the DDS-safe environment of
`sim2real_ros.ros.env.child_env()`, in its own session so that a terminal's Ctrl-C reaches only
the runner, which then stops the nodes in reverse start order: SIGINT to each, SIGKILL to what
is left after a grace period. Every output line is prefixed with its node's name. A node that
dies is reported; a restartable one is restarted (up to a limit), any other tears the whole
graph down and the runner exits non-zero, so a supervisor (systemd, CI) sees the failure.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from sim2real_ros.graph import RESTART_DELAY_S, RESTART_LIMIT, Graph, NodeSpec
from sim2real_ros.ros.env import child_env

EXIT_OK = 0
EXIT_NODE_DIED = 1
EXIT_UNCLEAN_SHUTDOWN = 3
# A node that exits with this code refused its configuration (spin_node's ConfigError exit);
# restarting it would only refuse again, so it is fatal even when the node is restartable.
EXIT_REFUSED_CONFIG = 2


@dataclass
class RunnerEvent:
    """Something that happened to a node process (for the log and the demo's summary)."""

    t_s: float  # seconds since the runner started
    node: str
    kind: str  # started | exited | restarted | gave_up | killed | stopped
    detail: str = ""
    returncode: int | None = None


def describe_returncode(rc: int | None) -> str:
    """Return 'exit code N' or 'signal NAME' for a Popen return code."""
    if rc is None:
        return "running"
    if rc < 0:
        try:
            return f"signal {signal.Signals(-rc).name}"
        except ValueError:
            return f"signal {-rc}"
    return f"exit code {rc}"


@dataclass
class _Proc:
    spec: NodeSpec
    popen: subprocess.Popen[bytes]
    pump: threading.Thread
    restarts: int = 0
    expected_exit: bool = False


@dataclass
class RunnerConfig:
    """How the runner treats its processes."""

    grace_s: float = 10.0  # SIGINT -> SIGKILL
    max_restarts: int = RESTART_LIMIT  # per restartable node over the whole run
    restart_delay_s: float = RESTART_DELAY_S
    poll_period_s: float = 0.05
    python: str = sys.executable
    extra_env: dict[str, str] = field(default_factory=dict)


class GraphRunner:
    """Start, watch, restart and stop the nodes of one graph."""

    def __init__(self, graph: Graph, out: TextIO | None = None, log_dir: Path | None = None,
                 config: RunnerConfig | None = None) -> None:
        self.graph = graph
        self.config = config or RunnerConfig()
        self._out = out if out is not None else sys.stdout
        self._out_lock = threading.Lock()
        self._tmp = tempfile.TemporaryDirectory(prefix="sim2real-run-")
        self.log_dir = Path(log_dir) if log_dir is not None else None
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
        self._procs: dict[str, _Proc] = {}
        self._pending_restart: dict[str, float] = {}
        self.events: list[RunnerEvent] = []
        self._t0 = time.monotonic()
        self.failed_node: str | None = None
        # Refuse early (before any process exists) when the DDS environment is unsafe.
        self._env = child_env(self.config.extra_env)

    # -- output ---------------------------------------------------------------------------
    def say(self, text: str, node: str = "runner") -> None:
        """Print one line with a name prefix."""
        with self._out_lock:
            self._out.write(f"[{node}] {text}\n")
            self._out.flush()

    def _event(self, node: str, kind: str, detail: str = "", rc: int | None = None) -> None:
        self.events.append(RunnerEvent(time.monotonic() - self._t0, node, kind, detail, rc))

    def _pump(self, name: str, stream: TextIO | None, log_path: Path | None) -> None:
        if stream is None:
            return
        log = open(log_path, "a", encoding="utf-8") if log_path else None  # noqa: SIM115
        try:
            for raw in stream:
                line = raw.rstrip("\n")
                with self._out_lock:
                    self._out.write(f"[{name}] {line}\n")
                    self._out.flush()
                if log is not None:
                    log.write(line + "\n")
                    log.flush()
        except ValueError:
            pass  # stream closed under us at shutdown
        finally:
            if log is not None:
                log.close()

    # -- processes ------------------------------------------------------------------------
    def _override_file(self, spec: NodeSpec) -> Path | None:
        if not spec.parameters:
            return None
        path = Path(self._tmp.name) / f"{spec.name}.overrides.yaml"
        path.write_text(spec.override_params_yaml())
        return path

    def command(self, spec: NodeSpec) -> list[str]:
        """Return the command line the runner uses for `spec`."""
        return spec.command(self._override_file(spec), python=self.config.python)

    def _spawn(self, spec: NodeSpec) -> subprocess.Popen[bytes]:
        nice = int(spec.nice)

        def lower_priority() -> None:  # in the child, before exec
            os.nice(nice)

        popen = subprocess.Popen(
            self.command(spec),
            env=self._env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            # Own session: a terminal's Ctrl-C goes to the runner only, which stops the nodes
            # in order instead of all of them racing each other.
            start_new_session=True,
            preexec_fn=lower_priority if nice > 0 else None,  # noqa: PLW1509 - os.nice only
        )
        return popen  # type: ignore[return-value]

    def _start_one(self, spec: NodeSpec, restarts: int = 0) -> None:
        popen = self._spawn(spec)
        log_path = self.log_dir / f"{spec.name}.log" if self.log_dir else None
        pump = threading.Thread(target=self._pump, args=(spec.name, popen.stdout, log_path),
                                daemon=True, name=f"pump-{spec.name}")
        pump.start()
        self._procs[spec.name] = _Proc(spec, popen, pump, restarts=restarts)
        kind = "restarted" if restarts else "started"
        self._event(spec.name, kind, f"pid {popen.pid}")
        self.say(f"{kind} {spec.name} (pid {popen.pid})")

    def start(self) -> None:
        """Start every node in graph order."""
        self._t0 = time.monotonic()
        self.say(f"starting {len(self.graph.nodes)} nodes, backend {self.graph.backend.name}: "
                 + ", ".join(self.graph.names()))
        for spec in self.graph.nodes:
            self._start_one(spec)

    def pid(self, name: str) -> int:
        """Return the pid of node `name`'s current process."""
        return self._procs[name].popen.pid

    def is_running(self, name: str) -> bool:
        """Return whether node `name` currently has a live process."""
        p = self._procs.get(name)
        return p is not None and p.popen.poll() is None

    def running(self) -> list[str]:
        """Return the names of nodes with a live process."""
        return [n for n in self._procs if self.is_running(n)]

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send `sig` to node `name` (scripted faults); the watch loop handles the exit."""
        proc = self._procs[name]
        self._event(name, "killed", signal.Signals(sig).name)
        self.say(f"sending {signal.Signals(sig).name} to {name} (pid {proc.popen.pid})")
        os.kill(proc.popen.pid, sig)

    def restarts(self, name: str) -> int:
        """Return how often node `name` was restarted."""
        return self._procs[name].restarts if name in self._procs else 0

    def poll(self) -> str | None:
        """Handle exited nodes; return the name of a node whose death ends the graph, else None.

        A restartable node under its restart limit is restarted after `restart_delay_s`.
        """
        now = time.monotonic()
        for name, due in list(self._pending_restart.items()):
            if now >= due:
                del self._pending_restart[name]
                old = self._procs[name]
                self._start_one(old.spec, restarts=old.restarts + 1)
        for name, proc in list(self._procs.items()):
            rc = proc.popen.poll()
            if rc is None or proc.expected_exit or name in self._pending_restart:
                continue
            proc.expected_exit = True  # handled once
            how = describe_returncode(rc)
            self._event(name, "exited", how, rc)
            if rc == EXIT_REFUSED_CONFIG:
                self.say(f"node {name} refused its configuration ({how}); see its log above. "
                         "Tearing the graph down")
                self.failed_node = name
                return name
            if proc.spec.restartable and proc.restarts < self.config.max_restarts:
                self.say(f"node {name} died ({how}); restarting "
                         f"({proc.restarts + 1}/{self.config.max_restarts})")
                self._pending_restart[name] = now + self.config.restart_delay_s
                continue
            if proc.spec.restartable:
                self._event(name, "gave_up", f"after {proc.restarts} restarts")
                self.say(f"node {name} died ({how}) after {proc.restarts} restarts, the limit; "
                         "tearing the graph down")
            else:
                self.say(f"node {name} died ({how}); tearing the graph down")
            self.failed_node = name
            return name
        return None

    def stop(self) -> bool:
        """Stop every node: SIGINT in reverse start order, SIGKILL after the grace period.

        Return True when every node left on SIGINT (a clean shutdown).
        """
        self._pending_restart.clear()
        live = [p for p in reversed(list(self._procs.values())) if p.popen.poll() is None]
        for p in live:
            p.expected_exit = True
            try:
                os.killpg(p.popen.pid, signal.SIGINT)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + self.config.grace_s
        clean = True
        for p in live:
            try:
                p.popen.wait(timeout=max(0.05, deadline - time.monotonic()))
                self._event(p.spec.name, "stopped", describe_returncode(p.popen.returncode),
                            p.popen.returncode)
            except subprocess.TimeoutExpired:
                clean = False
                self.say(f"{p.spec.name} ignored SIGINT for {self.config.grace_s:.1f} s; SIGKILL")
                try:
                    os.killpg(p.popen.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.popen.wait()
                self._event(p.spec.name, "killed", "SIGKILL after grace period",
                            p.popen.returncode)
        for p in self._procs.values():
            p.pump.join(timeout=2.0)
            if p.popen.stdout is not None:
                p.popen.stdout.close()
        self._tmp.cleanup()
        return clean

    def run(self, duration_s: float | None = None) -> int:
        """Start the graph and watch it until Ctrl-C/SIGTERM, `duration_s`, or a fatal death."""
        stop_requested = threading.Event()
        reason = ["duration elapsed"]

        def on_signal(signum: int, _frame: object) -> None:
            reason[0] = signal.Signals(signum).name
            stop_requested.set()

        in_main = threading.current_thread() is threading.main_thread()
        previous = {}
        if in_main:
            for sig in (signal.SIGINT, signal.SIGTERM):
                previous[sig] = signal.signal(sig, on_signal)
        code = EXIT_OK
        try:
            self.start()
            end = None if duration_s is None else time.monotonic() + duration_s
            while not stop_requested.is_set():
                if end is not None and time.monotonic() >= end:
                    break
                if self.poll() is not None:
                    code = EXIT_NODE_DIED
                    reason[0] = f"node {self.failed_node} died"
                    break
                stop_requested.wait(self.config.poll_period_s)
        finally:
            self.say(f"stopping ({reason[0]})")
            clean = self.stop()
            if in_main:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)
        if code == EXIT_OK and not clean:
            code = EXIT_UNCLEAN_SHUTDOWN
        self.say(f"all nodes stopped{'' if clean else ' (some needed SIGKILL)'}; exit {code}")
        return code
