"""Fan-out shaped like the translation pipelines: a stage's instances may
differ per axis value (teachers per language pair), and a stage that reads
every instance of another gathers the ones of its own axis value."""

from __future__ import annotations

from pathlib import Path

import yaml
from conftest import read_manifest, write_config
from test_series import _job_stats, reported, tiny_pipeline

PER_PAIR = '''
from waypost.snakemake import Pipeline
wp = Pipeline(config, workflow, axis="lang")


def teachers(experiment, lang):
    return [f"t{i}" for i in range(config["experiments"][experiment]["teachers"][lang])]


rule teach:
    output: model=wp.out("model.txt", instances=teachers)
    shell: "echo {wildcards.lang} {wildcards.instance} > {output.model}"


rule ensemble:
    input: models=wp.each("teach", "model.txt")
    output: out=wp.out("ensemble.txt")
    shell: "cat {input.models} > {output.out}"


rule overview:
    input: ensembles=wp.each("ensemble", "ensemble.txt")
    output: out=wp.out("overview.txt", funnel=True)
    shell: "cat {input.ensembles} > {output.out}"


wp.finish()

rule all:
    default_target: True
    input: wp.targets
'''


def config(counts: dict) -> dict:
    return {"root": "out", "experiments": {"run1": {"langs": list(counts), "teachers": counts}}}


def test_a_stage_can_have_a_number_of_instances_per_axis_value(tmp_path: Path):
    run = tiny_pipeline(tmp_path, PER_PAIR, config({"cs-en": 1, "uk-en": 3}))
    (tmp_path / "workflow" / "schemas").mkdir()
    (tmp_path / "workflow" / "schemas" / "config.schema.yaml").write_text(yaml.safe_dump({"properties": {
        "experiments": {"additionalProperties": {"properties": {"teachers": {
            "type": "object", "additionalProperties": {"type": "integer", "minimum": 1}}}}}}}))
    first = run()
    assert first.returncode == 0, first.stderr[-3000:]
    out = tmp_path / "out"
    assert sorted(p.name for p in (out / "cs-en/run1/teach").iterdir() if p.is_dir()) == ["t0"]
    assert sorted(p.name for p in (out / "uk-en/run1/teach").iterdir() if p.is_dir()) == ["t0", "t1", "t2"]
    # each ensemble gathers its own pair's teachers; the funnel every pair's ensemble
    assert (out / "uk-en/run1/ensemble/ensemble.txt").read_text() == "uk-en t0\nuk-en t1\nuk-en t2\n"
    assert (out / "_all/run1/overview/overview.txt").read_text() == "cs-en t0\nuk-en t0\nuk-en t1\nuk-en t2\n"
    assert len(read_manifest(out / "uk-en/run1/ensemble")["inputs"]) == 3

    # One pair gets another teacher: that teacher is made and that pair's
    # ensemble redone (its set of teachers changed); the other pair's work
    # is left as it is, and so is the overview in presence mode (its set of
    # ensembles is the same: `waypost rerun overview` redoes it).
    write_config(tmp_path, config({"cs-en": 2, "uk-en": 3}), name="config/config.yaml")
    planned = run("-n", *reported(tmp_path))
    assert planned.returncode == 0, planned.stderr[-3000:]
    assert "run1/cs-en/ensemble: made from 1 inputs, now 2 (1 new, 0 gone): redone" in planned.stderr
    assert _job_stats(tmp_path / "events.jsonl") == {"teach": 1, "ensemble": 1}
    second = run()
    assert second.returncode == 0, second.stderr[-3000:]
    assert (out / "cs-en/run1/ensemble/ensemble.txt").read_text() == "cs-en t0\ncs-en t1\n"
    assert "Nothing to be done" in (lambda p: p.stdout + p.stderr)(run("-n"))
