"""The DDS environment every process of ours runs in: loopback only, a run-unique domain."""

from __future__ import annotations

import os

DISCOVERY_VAR = "ROS_AUTOMATIC_DISCOVERY_RANGE"
DOMAIN_VAR = "ROS_DOMAIN_ID"


def dds_env_problems(env: dict[str, str] | None = None) -> list[str]:
    """Return what is wrong with the DDS environment (empty when loopback-only with a domain)."""
    e = os.environ if env is None else env
    problems = []
    if e.get(DISCOVERY_VAR) != "LOCALHOST":
        problems.append(f"{DISCOVERY_VAR}={e.get(DISCOVERY_VAR)!r}, expected 'LOCALHOST'")
    dom = e.get(DOMAIN_VAR)
    if dom is None or not dom.isdigit() or not 0 <= int(dom) <= 232:
        problems.append(f"{DOMAIN_VAR}={dom!r}, expected an integer in [0, 232]")
    return problems


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Return the environment for a child process; refuse to hand on an unsafe DDS setup."""
    env = dict(os.environ)
    env.update(extra or {})
    problems = dds_env_problems(env)
    if problems:
        raise RuntimeError("refusing to start a ROS process: " + "; ".join(problems))
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env
