"""The workspace a step runner works in when its record directory is a
bucket's URL (``mirror.BucketWorkspace``): a stage's whole stage directory,
or a rule in its own layout's record with its outputs elsewhere in the
bucket."""

from __future__ import annotations

from waypost.model.job import Job
from waypost.model.layout import stage_root
from waypost.model.locations import is_bucket_url
from waypost.stores.mirror import BucketWorkspace, local_of


def for_runner(step) -> tuple[BucketWorkspace | None, list[str], list[str]]:
    """The remote stage of a runner whose stage directory is a bucket's URL
    (None for a local one), and the paths of the step's inputs and outputs
    it works with: their local copies (the command has them already:
    Snakemake formatted it with these paths)."""
    if not is_bucket_url(step.stage_dir):
        return None, step.inputs, step.outputs
    if not step.mirror:
        raise SystemExit("waypost.runner: a bucket's stage directory needs the spec's mirror (where to copy it)")

    def local(url: str) -> str:
        return local_of(step.mirror, url)
    stage = BucketWorkspace(step.stage_dir, local(step.stage_dir), Job.of_step(step, local),
                            [local(d) for d in step.own_dirs], [local(d) for d in step.input_dirs])
    stage.outside.logs = [local(f) for f in step.log_files]
    stage.root_local = stage_root(stage.local, step.instance)
    return stage, [local(u) for u in step.inputs], [local(u) for u in step.outputs]
