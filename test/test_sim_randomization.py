"""Randomization spec parsing, validation messages and the seeded sampler."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from sim2real_ros.config import ConfigError
from sim2real_ros.paths import default_urdf, share_path
from sim2real_ros.robot.model import load_arm
from sim2real_ros.sim.plant import PlantParams
from sim2real_ros.sim.randomization import (
    GROUPS,
    TERMS,
    Draw,
    Nominal,
    RandomizationSpec,
    load_calibration,
    sample,
)

ARM = load_arm(default_urdf())
SHIPPED = share_path("config", "randomization.yaml")


def spec_of(terms: dict) -> RandomizationSpec:
    return RandomizationSpec.from_dict({"terms": terms}, "inline.yaml", ARM)


def write(tmp_path: Path, data: dict, name: str = "spec.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def test_shipped_spec_covers_every_term_and_every_gap() -> None:
    spec = RandomizationSpec.from_yaml(SHIPPED, ARM)
    assert set(spec.terms) == set(TERMS)
    assert {TERMS[n].group for n in spec.terms} == set(GROUPS)


def test_same_seed_gives_same_draw_and_json_round_trips_exactly() -> None:
    spec = RandomizationSpec.from_yaml(SHIPPED, ARM)
    a = sample(spec, np.random.default_rng(7), "startup", ARM)
    b = sample(spec, np.random.default_rng(7), "startup", ARM)
    c = sample(spec, np.random.default_rng(8), "startup", ARM)
    assert a.to_json() == b.to_json()
    assert a.to_json() != c.to_json()
    back = Draw.from_json(a.to_json())
    assert back.to_json() == a.to_json()
    assert np.array_equal(back.plant.joint_damping_nms, a.plant.joint_damping_nms)


def test_adding_a_term_leaves_the_other_terms_values_unchanged() -> None:
    one = spec_of({"joint_damping": {"operation": "scale", "range": [0.5, 2.0], "mode": "reset"}})
    two = spec_of(
        {
            "joint_damping": {"operation": "scale", "range": [0.5, 2.0], "mode": "reset"},
            "payload_mass": {"operation": "abs", "range": [0.0, 2.0], "mode": "reset"},
        }
    )
    a = sample(one, np.random.default_rng(3), "startup", ARM)
    b = sample(two, np.random.default_rng(3), "startup", ARM)
    assert a.values["joint_damping"] == b.values["joint_damping"]


def test_operations_act_on_the_nominal_value_and_joint_subsets_keep_the_rest() -> None:
    urdf_damping = np.array([ARM.all_joints[j].damping for j in ARM.joint_names])
    spec = spec_of(
        {
            "joint_damping": {
                "operation": "scale", "range": [3.0, 3.0], "mode": "reset",
                "joints": ["elbow_joint"],
            },
            "joint_friction": {"operation": "abs", "range": [0.4, 0.4], "mode": "reset"},
            "payload_mass": {"operation": "add", "range": [0.5, 0.5], "mode": "reset"},
        }
    )
    nominal = Nominal.for_arm(ARM, PlantParams(payload_kg=1.0))
    d = sample(spec, np.random.default_rng(0), "startup", ARM, nominal)
    expected = urdf_damping.copy()
    expected[2] *= 3.0
    assert np.allclose(d.plant.joint_damping_nms, expected)
    assert np.allclose(d.plant.joint_friction_nm, 0.4)
    assert d.plant.payload_kg == pytest.approx(1.5)


def test_distributions_have_the_stated_moments() -> None:
    spec = spec_of(
        {
            "joint_position_bias": {
                "operation": "add", "distribution": "gaussian", "range": [0.01, 0.002],
                "mode": "reset",
            },
            "kp": {
                "operation": "scale", "distribution": "log_uniform", "range": [0.5, 2.0],
                "mode": "reset",
            },
            "joint_friction": {
                "operation": "abs", "distribution": "uniform", "range": [0.1, 0.3],
                "mode": "reset",
            },
        }
    )
    rng = np.random.default_rng(1)
    draws = [sample(spec, rng, "startup", ARM) for _ in range(400)]
    bias = np.concatenate([d.sensor.position_bias_rad for d in draws])
    kp = np.concatenate([d.plant.kp_scale for d in draws])
    fr = np.concatenate([d.plant.joint_friction_nm for d in draws])
    assert bias.mean() == pytest.approx(0.01, abs=2e-4)
    assert bias.std() == pytest.approx(0.002, rel=0.05)
    assert np.log(kp).mean() == pytest.approx(0.0, abs=0.03)  # symmetric in log space
    assert kp.min() >= 0.5 and kp.max() <= 2.0
    assert fr.min() >= 0.1 and fr.max() <= 0.3 and fr.mean() == pytest.approx(0.2, abs=0.005)


def test_shared_term_draws_one_value_for_every_joint() -> None:
    spec = spec_of({"kd": {"operation": "scale", "range": [0.5, 2.0], "mode": "reset",
                           "shared": True}})
    d = sample(spec, np.random.default_rng(4), "startup", ARM)
    assert np.ptp(d.plant.kd_scale) == 0.0 and d.plant.kd_scale[0] != 1.0


def test_reset_mode_keeps_startup_terms_and_redraws_reset_terms() -> None:
    spec = spec_of(
        {
            "armature": {"operation": "scale", "range": [0.5, 2.0], "mode": "startup"},
            "joint_friction": {"operation": "abs", "range": [0.0, 1.0], "mode": "reset"},
        }
    )
    first = sample(spec, np.random.default_rng(1), "startup", ARM)
    again = sample(spec, np.random.default_rng(2), "reset", ARM, base=first)
    assert again.values["armature"] == first.values["armature"]
    assert again.values["joint_friction"] != first.values["joint_friction"]


@pytest.mark.parametrize(
    ("term", "key", "fragment"),
    [
        ({"joint_dampin": {"operation": "scale", "range": [0.5, 2], "mode": "reset"}},
         "terms.joint_dampin", "known term"),
        ({"joint_damping": {"operation": "scale", "range": [2.0, 0.5], "mode": "reset"}},
         "terms.joint_damping.range", "low <= high"),
        ({"joint_position_noise": {"operation": "add", "distribution": "gaussian",
                                   "range": [0.0, -0.1], "mode": "reset"}},
         "terms.joint_position_noise.range", "std >= 0"),
        ({"joint_damping": {"operation": "scale", "range": [0.5, 2], "mode": "reset",
                            "joints": ["elbow", "wrist_1_joint"]}},
         "terms.joint_damping.joints", "a joint of the arm"),
        ({"com_offset": {"operation": "add", "range": [0, 0.01], "mode": "reset",
                         "links": ["forearm"]}},
         "terms.com_offset.links", "a moving link"),
        ({"kp": {"operation": "multiply", "range": [0.5, 2], "mode": "reset"}},
         "terms.kp.operation", "one of ['scale', 'add', 'abs']"),
        ({"kp": {"operation": "scale", "distribution": "normal", "range": [0.5, 2],
                 "mode": "reset"}},
         "terms.kp.distribution", "uniform"),
        ({"kp": {"operation": "scale", "range": [0.5, 2], "mode": "episode"}},
         "terms.kp.mode", "startup"),
        ({"kp": {"operation": "scale", "distribution": "log_uniform", "range": [0.0, 2],
                 "mode": "reset"}},
         "terms.kp.range", "> 0"),
        ({"action_drop": {"operation": "abs", "range": [0.0, 1.5], "mode": "reset"}},
         "terms.action_drop.range", "within [0, 1]"),
        ({"pixel_noise": {"operation": "abs", "range": [0, 2], "mode": "interval"}},
         "terms.pixel_noise.interval_s", "seconds"),
        ({"kp": {"operation": "scale", "range": [0.5, 2], "mode": "reset", "jonts": ["a"]}},
         "terms.kp.jonts", "a term key"),
    ],
)
def test_bad_spec_is_rejected_naming_file_key_and_value(
    tmp_path: Path, term: dict, key: str, fragment: str
) -> None:
    path = write(tmp_path, {"terms": term})
    with pytest.raises(ConfigError) as info:
        RandomizationSpec.from_yaml(path, ARM)
    msg = str(info.value)
    assert info.value.key == key
    assert str(path) in msg and fragment in msg


def test_calibration_file_gives_nominal_and_its_randomization_section(tmp_path: Path) -> None:
    cal = {
        "unit": "arm-SN1",
        "nominal": {"joint_damping_nms": [1.0, 1.1, 0.9, 0.2, 0.2, 0.1], "payload_kg": 0.4},
        "randomization": {
            "terms": {"joint_damping": {"operation": "scale", "range": [0.9, 1.1],
                                        "mode": "reset"}}
        },
    }
    path = write(tmp_path, cal, "arm-SN1.yaml")
    nominal, spec = load_calibration(path, ARM)
    assert spec is not None and set(spec.terms) == {"joint_damping"}
    assert RandomizationSpec.from_yaml(path, ARM).sha256 == spec.sha256
    d = sample(spec, np.random.default_rng(0), "startup", ARM, Nominal.for_arm(ARM, nominal))
    ratio = d.plant.joint_damping_nms / np.array(cal["nominal"]["joint_damping_nms"])
    assert np.all((ratio >= 0.9) & (ratio <= 1.1))
    assert d.plant.payload_kg == pytest.approx(0.4)
    cal["randomization"]["terms"]["joint_damping"]["range"] = [1.1, 0.9]
    bad = write(tmp_path, cal, "bad.yaml")
    with pytest.raises(ConfigError) as info:
        RandomizationSpec.from_yaml(bad, ARM)
    assert info.value.key == "randomization.terms.joint_damping.range"
    cal["nominal"] = {"damping": 1.0}
    with pytest.raises(ConfigError, match="nominal.damping"):
        load_calibration(write(tmp_path, cal, "bad2.yaml"), ARM)


def test_disabled_spec_draw_is_the_nominal_plant() -> None:
    d = sample(RandomizationSpec.disabled(), np.random.default_rng(0), "startup", ARM)
    assert d.values == {}
    assert d.plant.payload_kg == 0.0 and np.allclose(d.plant.gravity, [0, 0, -9.81])
    assert d.latency.action_delay_s == 0.0


def test_cli_draw_is_reproducible_and_check_spec_names_the_bad_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from sim2real_ros.cli import main

    outs = []
    for seed in (4, 4, 5):
        assert main(["sim", "draw", "--seed", str(seed)]) == 0
        outs.append(json.loads(capsys.readouterr().out))
    assert outs[0] == outs[1] and outs[0] != outs[2]
    assert outs[0]["seed"] == 4 and set(outs[0]["values"]) == set(TERMS)
    assert main(["sim", "check-spec", str(SHIPPED)]) == 0
    assert "gaps covered: actuator, dynamics, latency, sensor, visual" in capsys.readouterr().out
    bad = write(tmp_path, {"terms": {"kp": {"operation": "scale", "range": [0.5, 2],
                                            "mode": "sometimes"}}})
    assert main(["sim", "check-spec", str(bad)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "terms.kp.mode" in err and "'sometimes'" in err
