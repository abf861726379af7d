"""`sim2real sysid ...`: synth -> info -> fit -> calibration + report; refusals write nothing."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from sim2real_ros.cli import main
from sim2real_ros.sysid import bags
from sim2real_ros.sysid.calibration import load_calibration
from sim2real_ros.sysid.runs import load_run
from sim2real_ros.sysid.synth import write_run_bag

JOINTS = ["shoulder_pan_joint", "shoulder_lift_joint", "elbow_joint", "wrist_1_joint",
          "wrist_2_joint", "wrist_3_joint"]


@pytest.fixture(scope="module")
def synth_bags(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("synth")
    assert main(["sysid", "synth", str(out), "--runs", "2", "--duration", "3",
                 "--unit", "SN-C"]) == 0
    return out


FIT = ["--params", "joint_friction_nm", "--max-iterations", "2", "--window-every", "0.5",
       "--no-progress"]


def test_info_shows_the_unit(synth_bags: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sysid", "info", str(synth_bags / "SN-C_run0")]) == 0
    out = capsys.readouterr().out
    assert "unit SN-C" in out and "/joint_states" in out and "complete" in out


def test_fit_writes_calibration_and_report_then_refuses_to_overwrite(
        synth_bags: Path, tmp_path: Path) -> None:
    out = tmp_path / "cal" / "SN-C.yaml"
    rc = main(["sysid", "fit", str(synth_bags / "SN-C_run0"), str(synth_bags / "SN-C_run1"),
               "-o", str(out), "--report", str(tmp_path / "rep"), *FIT])
    assert rc == 0
    c = load_calibration(out)
    assert c.unit_id == "SN-C" and c.n_runs == 2 and c.fit["validation_runs"] == ["SN-C_run1"]
    assert (tmp_path / "rep" / "report.md").is_file()
    before = out.read_bytes()
    rc = main(["sysid", "fit", str(synth_bags / "SN-C_run0"), str(synth_bags / "SN-C_run1"),
               "-o", str(out), *FIT])
    assert rc == 2 and out.read_bytes() == before
    # --force never replaces the calibration of another unit
    other = yaml.safe_load(before.split(b"\n", 1)[1])
    other["unit"]["serial"] = "SN-OTHER"
    out.write_text(yaml.safe_dump(other))
    before = out.read_bytes()
    rc = main(["sysid", "fit", str(synth_bags / "SN-C_run0"), str(synth_bags / "SN-C_run1"),
               "-o", str(out), "--force", *FIT])
    assert rc == 2 and out.read_bytes() == before


def test_bad_inputs_are_refused_and_nothing_is_written(
        synth_bags: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "SN-C.yaml"
    # a run of another unit among the bags
    foreign = tmp_path / "SN-D_run0"
    run = load_run(synth_bags / "SN-C_run0", JOINTS)
    write_run_bag(foreign, run, bags.unit_metadata("SN-D", cell="synthetic"))
    assert bags.bag_metadata(foreign)["unit"]["serial"] == "SN-D"
    assert main(["sysid", "fit", str(synth_bags / "SN-C_run0"), str(foreign), "-o", str(out),
                 *FIT]) == 2
    assert "different units" in capsys.readouterr().err
    # --unit says which unit is expected
    assert main(["sysid", "fit", str(synth_bags / "SN-C_run0"), "-o", str(out), "--unit",
                 "SN-Z", *FIT]) == 2
    assert "expected --unit 'SN-Z'" in capsys.readouterr().err
    # a truncated bag
    broken = tmp_path / "SN-C_broken"
    shutil.copytree(synth_bags / "SN-C_run1", broken)
    (f,) = broken.glob("*.mcap")
    f.write_bytes(f.read_bytes()[:1000])
    assert main(["sysid", "fit", str(synth_bags / "SN-C_run0"), str(broken), "-o", str(out),
                 *FIT]) == 2
    assert "truncated or corrupt" in capsys.readouterr().err
    assert not out.exists()
