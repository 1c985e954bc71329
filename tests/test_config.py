"""Config validation: clear errors naming file, key and expectation; nothing
runs and nothing is written on bad input."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
from conftest import REFERENCE_AXIS, REFERENCE_STAGES, REPO, SMALL_CONFIG, prepare_reference, snakemake, write_config

from waypost.model import config as wconfig

WORKFLOW = str(REPO / "workflow")


def check(raw: dict):
    return prepare_reference(raw)


def with_change(change) -> dict:
    cfg = copy.deepcopy(SMALL_CONFIG)
    change(cfg)
    return cfg


def test_defaults_are_filled_and_merged():
    cfg = check(with_change(lambda c: c["experiments"]["exp1"].update(
        stages={"train_teacher": {"epochs": 9}}, per_pair={"en-xb": {"train_teacher": {"seed": 4}}})))
    assert cfg["rerun_policy"] == "presence"
    assert cfg["stages"]["clean_corpus"] == {"max_ratio": 2.0, "max_length": 80}
    assert wconfig.stage_settings(cfg, "exp1", "en-xa", "train_teacher") == {
        "epochs": 9, "subsample": 0.6, "policy": {}}
    assert wconfig.stage_settings(cfg, "exp1", "en-xb", "train_teacher") == {
        "epochs": 9, "subsample": 0.6, "seed": 4, "policy": {}}
    # Experiment overrides stay as written (defaults don't leak into them).
    assert cfg["experiments"]["exp1"]["stages"] == {"train_teacher": {"epochs": 9}}


def test_policy_merges_global_stage_experiment_and_pair():
    def change(c):
        c["policy"] = {"max_attempts": 2, "rerun": "clean"}
        c["stages"]["train_student"]["policy"] = {"max_attempts": 3, "checks": {"ok": "true"}}
        c["experiments"]["exp1"]["per_pair"] = {"en-xb": {"train_student": {"policy": {"rerun": "dirty"}}}}
    cfg = check(with_change(change))
    assert wconfig.stage_settings(cfg, "exp1", "en-xa", "train_student")["policy"] == {
        "max_attempts": 3, "rerun": "clean", "checks": {"ok": "true"}}
    assert wconfig.stage_settings(cfg, "exp1", "en-xb", "train_student")["policy"]["rerun"] == "dirty"
    assert wconfig.stage_settings(cfg, "exp1", "en-xa", "clean_corpus")["policy"] == {"max_attempts": 2, "rerun": "clean"}


def _policy(c, **policy):
    c["stages"]["train_student"]["policy"] = policy


BAD = {
    "wrong type": (lambda c: c["stages"]["train_student"].update(epochs="many"),
                   "stages.train_student.epochs: expected integer"),
    "unknown key": (lambda c: c["stages"]["train_student"].update(learning_rate=1),
                    "stages.train_student.learning_rate: unknown key 'learning_rate'"),
    "unknown top-level key": (lambda c: c.update(roots="x"), "roots: unknown key 'roots'"),
    "unknown stage": (lambda c: c["stages"].update(train_giant={}), "stages.train_giant: unknown stage 'train_giant'"),
    "unknown pair": (lambda c: c["experiments"]["exp1"].update(per_pair={"en-zz": {}}),
                     "experiments.exp1.per_pair.en-zz: unknown pair 'en-zz'"),
    "slash in pair": (lambda c: c["experiments"]["exp1"].update(pairs=["en/xa"]),
                      "experiments.exp1.pairs[0]: 'en/xa' is not a valid name"),
    "dotdot experiment": (lambda c: c["experiments"].update({"..": {"pairs": ["en-xa"]}}),
                          "'..' is not a valid name"),
    "space in pair": (lambda c: c["experiments"]["exp1"].update(pairs=["en xa"]), "'en xa' is not a valid name"),
    "bad policy": (lambda c: c.update(rerun_policy="sometimes"), "rerun_policy: 'sometimes' is not one of"),
    "missing pairs": (lambda c: c["experiments"]["exp1"].pop("pairs"), "'pairs' is required"),
    "unknown state in cue": (lambda c: _policy(c, cues=[{"action": "restart", "when": "cmd.TIMEDOUT"}]),
                             "policy of stage train_student (experiment exp1, pair en-xa): cues[0].when: "
                             "'cmd.TIMEDOUT': unknown state 'TIMEDOUT'"),
    "unknown check in cue": (lambda c: _policy(c, cues=[{"action": "rerun", "when": "any(cmd.FAILED, ok.SUCCESS)"}]),
                             "unknown name 'ok' in ok.SUCCESS"),
    "unknown function": (lambda c: _policy(c, cues=[{"action": "rerun", "when": "some(cmd.FAILED)"}]),
                         "unknown function 'some'"),
    "bad action": (lambda c: _policy(c, cues=[{"action": "retry", "when": "cmd.FAILED"}]),
                   "policy.cues[0].action: 'retry' is not one of"),
    "bad depends": (lambda c: _policy(c, depends="all_fine"), "depends: 'all_fine'"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_config_is_a_clear_error(case):
    change, expected = BAD[case]
    with pytest.raises(wconfig.ConfigError) as err:
        check(with_change(change))
    assert "test.yaml" in str(err.value)
    assert expected in str(err.value)


def test_yaml_error_names_file_and_line(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("experiments:\n  a: {pairs: [en-xa]\n")
    with pytest.raises(wconfig.ConfigError, match=rf"{path}:3:1: invalid YAML"):
        wconfig.load(str(path), WORKFLOW, REFERENCE_AXIS, REFERENCE_STAGES)


@pytest.mark.parametrize("case", ["wrong type", "unknown stage", "slash in pair", "unknown pair"])
def test_snakemake_refuses_bad_config_before_any_job(tmp_path: Path, case):
    change, expected = BAD[case]
    write_config(tmp_path, with_change(change))
    proc = snakemake(tmp_path, check=False)
    assert proc.returncode != 0
    assert expected in proc.stderr + proc.stdout
    assert str(tmp_path / "config.yaml") in proc.stderr + proc.stdout
    assert not (tmp_path / "results").exists()


def test_snakemake_default_config_yaml_error_names_file(tmp_path: Path):
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.yaml").write_text("experiments: [\n")
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "workflow" / "Snakefile"),
                           "-n", "-c1"], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode != 0
    assert "config/config.yaml:2:1: invalid YAML" in proc.stderr + proc.stdout


def test_a_config_that_passed_is_remembered_and_one_that_failed_never(tmp_path, monkeypatch):
    """A pass is remembered by the hash of config and schema, so the next
    command skips jsonschema; any other config is validated in full."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    marks = tmp_path / "cache" / "waypost" / "valid-configs"
    check(copy.deepcopy(SMALL_CONFIG))
    assert len(list(marks.iterdir())) == 1
    for change in (BAD["wrong type"][0], lambda c: c["stages"]["train_student"].update(epochs="2")):
        with pytest.raises(wconfig.ConfigError, match=r"train_student\.epochs: expected integer"):
            check(with_change(change))                    # "2" is not 2, though both print alike
    assert len(list(marks.iterdir())) == 1

    (tmp_path / "not-a-dir").write_text("")               # a cache that can't be written is none
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "not-a-dir"))
    check(with_change(lambda c: c["stages"]["train_student"].update(epochs=3)))

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setitem(sys.modules, "jsonschema", None)   # importing it would fail now
    check(copy.deepcopy(SMALL_CONFIG))
    with pytest.raises(ImportError):
        check(with_change(lambda c: c["stages"]["train_student"].update(epochs=4)))


@pytest.mark.parametrize("config, keys, top_level", [
    # No waypost key: the defaults (the pipeline's own root and experiment are its own).
    ({"root": "/data", "experiment": "x"}, {"root": ".waypost/records", "experiments": {"default": {}}}, False),
    # Under waypost: (the top level is the pipeline's), with --config over it.
    ({"root": "/data", "waypost": {"experiments": {"a": {}}}},
     {"root": ".waypost/records", "experiments": {"a": {}}, "pool": "big"}, False),
    # At the top level of a config with experiments there (the reference's): all of it.
    ({"root": "r", "experiments": {"a": {}}, "langs": ["de"]},
     {"root": "r", "experiments": {"a": {}}, "langs": ["de"]}, True),
])
def test_where_waypost_keys_are_in_a_pipelines_config(config, keys, top_level):
    overrides = {"waypost": {"pool": "big"}} if "waypost" in config else {}
    assert wconfig.waypost_config(config, overrides, None) == (keys, wconfig.NO_CONFIG_FILE, top_level)


def _workflow_with_schema(tmp_path, schema: str) -> str:
    (tmp_path / "schemas").mkdir(parents=True)
    (tmp_path / "schemas" / "config.schema.yaml").write_text(schema)
    return str(tmp_path)


def test_a_workflow_schema_that_allows_more_keys_is_respected(tmp_path):
    extends = "properties:\n  stages:\n    properties:\n      s: {properties: {n: {type: integer}}}\n"
    raw = {"experiments": {"e": {}}, "stages": {"s": {"n": 1}}, "threads_per_sample": 4, "ref": {"build": 38}}
    strict = _workflow_with_schema(tmp_path / "strict", extends)
    with pytest.raises(wconfig.ConfigError, match="ref: unknown key 'ref'"):
        wconfig.prepare(copy.deepcopy(raw), strict, "c.yaml", stages=["s"])   # (as before: only its keys)
    allows = _workflow_with_schema(tmp_path / "open", extends + "additionalProperties: true\n")
    assert wconfig.prepare(copy.deepcopy(raw), allows, "c.yaml", stages=["s"])["ref"] == {"build": 38}


def test_a_pipelines_own_schema_is_not_waypost_s(tmp_path):
    """The RNA-seq workflow's schema lists some of its keys (its Snakefile
    validates with it): waypost doesn't take it as its own."""
    own = _workflow_with_schema(tmp_path, "properties:\n  samples: {type: string}\nrequired: [samples]\n"
                                          "additionalProperties: false\n")
    prepared = wconfig.prepare({"experiments": {"e": {}}, "units": "u.tsv"}, own, "c.yaml", stages=[])
    assert prepared["units"] == "u.tsv"
