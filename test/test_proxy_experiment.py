"""`sim2real experiment transfer` as a user runs it: sealed stages, resume, corrupted artifacts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from sim2real_ros.ros.env import child_env

REPO = Path(__file__).resolve().parent.parent
# The smallest settings that still train, excite, fit, fine-tune, evaluate and score for real.
SMALL = ["--set", "train_iterations=1", "--set", "train_n_envs=2",
         "--set", "train_steps_per_iteration=30", "--set", "train_grad_steps=30",
         "--set", "train_members=2", "--set", "train_eval_episodes=2",
         "--set", "sim_episodes=2", "--set", "proxy_episodes=2", "--set", "excitation_s=6",
         "--set", "finetune_trajectories=5"]
# Every stage's artifacts that later stages or the reader rely on.
EXPECTED = {
    "s1_train": ["nominal/policy.pt", "randomized/policy.pt", "nominal/learning_curve.png",
                 "sim_eval_nominal.json", "sim_eval_randomized.json", "summary.json"],
    "s2_proxy_gap": ["proxy_eval_nominal.json", "proxy_eval_randomized.json",
                     "hil_record_nominal.json", "hil_record_randomized.json",
                     "audit_nominal/audit.json", "audit_randomized/audit.json",
                     "spec_nominal.yaml"],
    "s3a_sysid_record": ["bags/run_1/metadata.yaml", "bags/run_2/metadata.yaml",
                         "bags/run_3/metadata.yaml"],
    "s3b_sysid_fit": ["calibration.yaml"],
    "s3c_train_calibrated": ["calibrated/policy.pt", "sim_eval_calibrated.json"],
    "s3d_proxy_calibrated": ["proxy_eval_calibrated.json", "hil_record_calibrated.json",
                             "audit_calibrated/audit.json"],
    "s4a_collect": ["bags/collect/metadata.yaml", "collect_eval.json"],
    "s4b_finetune": ["finetuned/policy.pt", "finetune_report.json", "sim_eval_finetuned.json"],
    "s4c_proxy_finetuned": ["proxy_eval_finetuned.json", "hil_record_finetuned.json",
                            "audit_finetuned/audit.json"],
}


def transfer(run_dir: Path, *extra: str, timeout_s: float = 900.0
             ) -> subprocess.CompletedProcess[str]:
    """Run `sim2real experiment transfer --quick` in a child process, as a user would."""
    cmd = [sys.executable, "-m", "sim2real_ros.cli", "experiment", "transfer", "--quick",
           "--run-dir", str(run_dir), *SMALL, *extra]
    return subprocess.run(cmd, cwd=REPO, env=child_env(), capture_output=True, text=True,
                          timeout=timeout_s, check=False)


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the whole pipeline in real time: minutes on 2 shared cores
def test_quick_run_writes_every_artifact_and_a_corrupted_one_stops_the_resume(
        tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    first = transfer(run_dir)
    status = json.loads((run_dir / "status.json").read_text())
    assert first.returncode == 0 and not status["blocked"], (
        f"blocked: {status['blocked']}\n{first.stdout[-4000:]}\n{first.stderr[-4000:]}")
    for stage, files in EXPECTED.items():
        sealed = json.loads((run_dir / stage / "manifest.json").read_text())["files"]
        missing = [f for f in files if f not in sealed]
        assert not missing, f"{stage} lacks {missing}"
    results = json.loads((run_dir / "report" / "results.json").read_text())
    assert len(results["rows"]) == 4
    for row in results["rows"]:
        assert row["sim_success"] is not None and row["proxy_success"] is not None, row
        assert row["audit"] and set(row["audit"]) == {
            "visual", "dynamics", "sensor", "actuator", "latency", "safety"}, row
        # every proxy evaluation records how busy the host was (proxy.hostload)
        assert row["host_foreign_cores"] is not None and row["host_cpus"] >= 1, row
    assert results["parameter_recovery"]["parameters"]
    for name in ("results.md", "success.png", "final_errors.png", "parameter_recovery.png"):
        assert (run_dir / "report" / name).stat().st_size > 0
    assert "Host: cores that other work used" in (run_dir / "report" / "results.md").read_text()
    info = json.loads((run_dir / "run.json").read_text())
    assert info["quick"] is True and len(info["unit_file_sha256"]) == 64
    assert info["versions"]["mujoco"] != "not installed"
    dirty = info["versions"]["git_dirty"]
    assert dirty in ("no", "unknown") or dirty.startswith("yes: "), dirty
    # Step 3's bags carry the latency probe, and the fit took the latency from it.
    cal = yaml.safe_load((run_dir / "s3b_sysid_fit" / "calibration.yaml").read_text())
    assert cal["latency"]["action_latency_source"] == "probe", cal["latency"]
    probe = cal["latency"]["dead_time_probe"]
    assert probe["n_onsets"] >= 4 and probe["dead_time_s"] == cal["latency"]["action_latency_s"]
    assert (run_dir / "s3b_sysid_fit" / "fit_report" / "latency_probe.png").stat().st_size > 0
    # The step-4 fine-tune rehearsed in its parent's simulator (--quick: 50 steps x 8 envs).
    ft = json.loads((run_dir / "s4b_finetune" / "finetune_report.json").read_text())
    meta = ft["metadata"]["finetune"]
    assert meta["n_anchor_samples"] == 400 and meta["anchor_weight"] == 3.0, meta
    assert meta["fit_space"] == "step"
    if ft["parent_label"] == "calibrated":
        assert meta["anchor_source"].endswith("s3b_sysid_fit/calibration.yaml"), meta
    else:
        assert meta["anchor_source"].startswith("randomization "), meta

    # An intact run resumes without redoing anything.
    again = transfer(run_dir, "--resume")
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stdout.count("sealed, verified, reused") == len(EXPECTED)

    # One flipped byte in an intermediate artifact (the calibration the retraining used):
    # the resume stops before doing anything and names the file.
    calibration = run_dir / "s3b_sysid_fit" / "calibration.yaml"
    data = bytearray(calibration.read_bytes())
    data[len(data) // 2] ^= 0x01
    calibration.write_bytes(bytes(data))
    broken = transfer(run_dir, "--resume")
    assert broken.returncode == 2, broken.stdout + broken.stderr
    assert str(calibration) in broken.stderr and "sha256" in broken.stderr
    assert "modified or corrupted" in broken.stderr
    assert "sealed, verified, reused" not in broken.stdout


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
    assert main([*base, str(tmp_path / "probe"), "--set", "latency_probe_moves=8"]) == 2
    err = capsys.readouterr().err
    assert "latency_probe_moves = 8" in err and "multiple of 6" in err
    assert main([*base, str(tmp_path / "third"), "--resume"]) == 2
    assert "an existing run to resume" in capsys.readouterr().err
    assert main([*base, str(tmp_path / "fourth"), "--stage", "s9_magic"]) == 2
    assert "s1_train" in capsys.readouterr().err


def test_a_recording_the_filter_held_for_part_of_is_refused() -> None:
    """held_share: the filter's commands against the recorder's latest, by receive time."""
    from sim2real_ros.proxy.experiment import HELD_MAX_SHARE, held_share

    t = np.arange(0.0, 40.0, 0.01)
    ref = 0.2 * np.sin(2 * np.pi * 0.5 * t)[:, None] * np.ones((1, 6))
    # passed through (received 1 ms after the recorder's): nothing held
    share, worst = held_share(t + 0.001, ref, t, ref)
    assert share == 0.0 and worst == 0.0
    # the filter one command behind (a reordered tick): within tolerance
    lagged = np.vstack([ref[:1], ref[:-1]])
    assert held_share(t + 0.001, lagged, t, ref)[0] == 0.0
    # held from 12 s on, as in run 28's fourth run: refused
    held = ref.copy()
    held[t >= 12.0] = ref[t < 12.0][-1]
    share, worst = held_share(t + 0.001, held, t, ref)
    assert share > 10 * HELD_MAX_SHARE and worst > 0.2
    # nothing the recorder sent before the filter's commands: all of it counts
    assert held_share(t, ref, t + 100.0, ref) == (1.0, float("inf"))
