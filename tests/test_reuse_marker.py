"""A reuse is an attempt at work in its job's record directory, whatever the
job's layout: while the source's files come in, its running marker says so
(to a concurrent attempt, which waits, and to ``waypost status``), and it is
gone once the manifest is written."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import yaml
from test_own_layout_records import REUSING, _snakemake

from waypost.model import layout
from waypost.state import lifecycle, reuse


def test_a_reuse_of_a_job_in_its_own_layout_is_seen_at_work_while_its_files_come_in(tmp_path, monkeypatch):
    (tmp_path / "Snakefile").write_text(REUSING)
    (tmp_path / "alpha.yaml").write_text(yaml.safe_dump({"samples": ["s1"], "root": "records",
                                                         "data_dir": "out-alpha", "experiments": {"alpha": {}}}))
    ran = _snakemake(tmp_path, "--configfile", "alpha.yaml")
    assert ran.returncode == 0, ran.stderr[-3000:]
    record_dir = tmp_path / "records/_all/beta/train/s1"
    # the step spec of beta's train job, reused from alpha's (as the runner reads it)
    step = SimpleNamespace(stage_dir=str(record_dir), reuse_from=str(tmp_path / "records/_all/alpha/train/s1"),
                           own_layout=True, outputs=[str(tmp_path / "out-beta/models/s1/weights.bin")], inputs=[],
                           temporary=[], wildcards={"sample": "s1"}, experiment="beta", pair=layout.ALL_PAIRS,
                           stage="train", instance=None, mirror=None)
    seen = []
    bring = reuse.bring

    def watched(*args):   # what another process sees in the record directory while the files come in
        seen.append((lifecycle.live_attempt(str(record_dir)), json.loads((record_dir / layout.RUNNING).read_text())))
        return bring(*args)
    monkeypatch.setattr(reuse, "bring", watched)
    assert reuse.take(step) == 0
    (live, marker), = seen
    assert live is not None and f"pid {os.getpid()}" in live.where, live and live.where
    assert marker["outputs"] == ["weights.bin", "decoder.yml"] and marker["outputs_dir"] == "../../../../../out-beta/models/s1"
    assert not (record_dir / layout.RUNNING).exists()
    record = json.loads((record_dir / layout.MANIFEST).read_text())
    assert record["reused_from"] == step.reuse_from and record["declared"] == ["weights.bin"]
    assert (tmp_path / "out-beta/models/s1/decoder.yml").read_text() == "dim: 4\n"
