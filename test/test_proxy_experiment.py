"""`sim2real experiment transfer` as a user runs it: sealed stages, resume, corrupted artifacts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sim2real_ros.ros.env import child_env

REPO = Path(__file__).resolve().parent.parent
# The smallest settings that still train, evaluate and score for real.
TINY = ["--set", "train_iterations=1", "--set", "train_n_envs=2",
        "--set", "train_steps_per_iteration=20", "--set", "train_grad_steps=20",
        "--set", "train_members=2", "--set", "train_eval_episodes=2",
        "--set", "sim_episodes=2"]


def transfer(run_dir: Path, *extra: str, timeout_s: float = 600.0
             ) -> subprocess.CompletedProcess[str]:
    """Run `sim2real experiment transfer --quick` in a child process, as a user would."""
    cmd = [sys.executable, "-m", "sim2real_ros.cli", "experiment", "transfer", "--quick",
           "--run-dir", str(run_dir), *TINY, *extra]
    return subprocess.run(cmd, cwd=REPO, env=child_env(), capture_output=True, text=True,
                          timeout=timeout_s, check=False)


@pytest.mark.slow
def test_corrupted_intermediate_artifact_makes_the_resume_fail_naming_it(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    first = transfer(run_dir, "--stage", "s1_train")
    assert first.returncode == 0, first.stdout + first.stderr
    manifest = json.loads((run_dir / "s1_train" / "manifest.json").read_text())
    assert {"nominal/policy.pt", "randomized/policy.pt", "sim_eval_nominal.json",
            "sim_eval_randomized.json", "summary.json"} <= set(manifest["files"])
    assert (run_dir / "report" / "results.md").is_file()
    run_info = json.loads((run_dir / "run.json").read_text())
    assert run_info["quick"] is True and len(run_info["unit_file_sha256"]) == 64
    assert run_info["versions"]["mujoco"] != "not installed"

    # An intact run resumes without redoing the sealed stage.
    again = transfer(run_dir, "--resume", "--stage", "s1_train")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "sealed, verified, reused" in again.stdout

    # One flipped byte in an intermediate artifact: the resume stops and names the file.
    policy = run_dir / "s1_train" / "randomized" / "policy.pt"
    data = bytearray(policy.read_bytes())
    data[len(data) // 2] ^= 0xFF
    policy.write_bytes(bytes(data))
    broken = transfer(run_dir, "--resume")
    assert broken.returncode == 2, broken.stdout + broken.stderr
    assert str(policy) in broken.stderr and "sha256" in broken.stderr
    assert "modified or corrupted" in broken.stderr
    # Nothing after the check ran: no later stage folder appeared.
    assert not (run_dir / "s2_proxy_gap").exists()


def test_new_run_refuses_to_overwrite_and_bad_settings_name_the_key(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from sim2real_ros.cli import main

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.json").write_text("{}")
    base = ["experiment", "transfer", "--quick", "--run-dir"]
    assert main([*base, str(run_dir), "--stage", "s1_train"]) == 2
    assert "--resume" in capsys.readouterr().err
    assert main([*base, str(tmp_path / "other"), "--set", "sysid_runs=2"]) == 2
    err = capsys.readouterr().err
    assert "sysid_runs = 2" in err and "at least three runs" in err
    assert not (tmp_path / "other").exists()
    assert main([*base, str(tmp_path / "third"), "--resume"]) == 2
    assert "an existing run to resume" in capsys.readouterr().err
    assert main([*base, str(tmp_path / "fourth"), "--stage", "s9_magic"]) == 2
    assert "s1_train" in capsys.readouterr().err
