"""The workspace a step runner works in when its stage directory is a
``gs://`` URL: a stage's (``mirror.BucketWorkspace``) or, for a rule in its
own layout, one that also carries the job's outputs elsewhere in the bucket
(``ownbucket.OwnBucketWorkspace``)."""

from __future__ import annotations

from waypost.model.layout import stage_root
from waypost.model.locations import is_bucket_url
from waypost.stores.mirror import BucketWorkspace, local_of
from waypost.stores.ownbucket import OwnBucketWorkspace


def for_runner(step) -> tuple[BucketWorkspace | None, list[str], list[str]]:
    """The remote stage of a runner whose stage directory is a gs:// URL
    (None for a local one), and the paths of the step's inputs and outputs
    it works with: their local copies (the command has them already:
    Snakemake formatted it with these paths)."""
    if not is_bucket_url(step.stage_dir):
        return None, step.inputs, step.outputs
    if not step.mirror:
        raise SystemExit("waypost.runner: a gs:// stage directory needs the spec's mirror (where to copy it)")
    local = [local_of(step.mirror, u) for u in step.outputs]
    if step.own_layout:   # (its outputs elsewhere in the bucket)
        stage = OwnBucketWorkspace(step.stage_dir, local_of(step.mirror, step.stage_dir), local,
                                   [local_of(step.mirror, d) for d in step.own_dirs],
                                   [local_of(step.mirror, d) for d in step.input_dirs])
    else:
        stage = BucketWorkspace(step.stage_dir, local_of(step.mirror, step.stage_dir))
    stage.root_local = stage_root(stage.local, step.instance)
    return stage, [local_of(step.mirror, u) for u in step.inputs], local
