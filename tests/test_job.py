"""The one model of a job (``model.job.Job``): a ``wp.out`` stage's outputs
in its record directory, a rule in its own layout's where its rule puts
them, on disk and in a bucket alike."""

from __future__ import annotations

import os

from waypost.model import spec as wspec
from waypost.model.job import Job, outputs_base, outputs_elsewhere


def test_a_stage_is_a_job_whose_outputs_are_in_its_record_directory(tmp_path):
    stage_dir = str(tmp_path / "root/en-fr/e/train")
    step = wspec.StepSpec(experiment="e", stage="train", pair="en-fr", stage_dir=stage_dir,
                          outputs=[f"{stage_dir}/model.bin"])
    job = Job.of_step(step)
    assert job.outputs_in_record and job.base == stage_dir and job.outputs_dir is None
    assert job.outputs_outside_record == ()
    assert job.relative(f"{stage_dir}/model.bin") == "model.bin"
    assert job.record_fields() == {} and job.name == "e/en-fr/train"


def test_a_rule_in_its_own_layout_keeps_its_outputs_where_its_rule_puts_them(tmp_path):
    record_dir = str(tmp_path / "root/_all/e/measure/bog")
    outputs = [str(tmp_path / "work/bog/area.txt"), str(tmp_path / "work/bog/deep/len.txt")]
    step = wspec.StepSpec(experiment="e", stage="measure", pair="_all", stage_dir=record_dir, outputs=outputs,
                          own_layout=True, wildcards={"plot": "bog"})
    job = Job.of_step(step)
    assert not job.outputs_in_record and job.outputs_outside_record == tuple(outputs)
    assert job.base == str(tmp_path / "work/bog") and job.outputs_dir == "../../../../../work/bog"
    assert job.name == "measure[plot=bog]"
    assert job.record_fields() == {"outputs_dir": "../../../../../work/bog", "wildcards": {"plot": "bog"},
                                   "declared": ["area.txt", "deep/len.txt"]}
    # Its records read back: the same outputs, from the same base.
    data = {"stage": "measure", "outputs_dir": job.outputs_dir, "wildcards": {"plot": "bog"},
            "outputs": [{"path": "area.txt"}, {"path": "deep/len.txt"}]}
    again = Job.of_record(record_dir, data)
    assert outputs_elsewhere(data) and os.path.normpath(again.base) == job.base
    assert [os.path.normpath(o) for o in again.outputs] == outputs
    assert os.path.normpath(outputs_base(record_dir, data)) == job.base


def test_in_a_bucket_paths_from_the_record_to_the_outputs_are_reckoned_on_the_keys():
    job = Job.in_own_layout("measure", "gs://b/study/_all/e/measure/bog",
                            ["gs://b/study/work/bog/area.txt", "gs://b/study/work/bog/notes/n.txt"])
    assert job.base == "gs://b/study/work/bog" and job.outputs_dir == "../../../../work/bog"
    assert job.relative("gs://b/study/work/bog/notes/n.txt") == "notes/n.txt"
    assert job.output_path("area.txt") == "gs://b/study/work/bog/area.txt"
    assert not outputs_elsewhere({"outputs": []}) and outputs_base("gs://b/s/p/e/t", None) == "gs://b/s/p/e/t"
