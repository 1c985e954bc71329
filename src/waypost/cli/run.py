"""The commands that hand the workflow to Snakemake: ``waypost plan`` (a
dry run: what the next run would do and why, and the done stages that
drifted), ``waypost run`` and ``waypost cron``."""

from __future__ import annotations

import json
import os
import shlex
import sys

from waypost import stores
from waypost.cli import termwidth
from waypost.cli.args import (
    extra_args,
    load_config,
    reach,
    snakemake_profile,
    stage_args,
    with_profile_config,
    workflow_facts,
)
from waypost.model import config as wconfig
from waypost.model import graph, layout
from waypost.ops import inputdrift


def cmd_plan(args) -> int:
    """What the next run would do and why, and the done stages that drifted:
    computed here, printed as JSON or by ``planview``."""
    from waypost.cli import planview  # (rich, loaded only for the commands that print tables)

    cfg = load_config(args)
    code, report = plan_report(args, cfg)
    if report is None:
        return code
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        planview.render(termwidth.console(args.width), report, wconfig.derived(cfg).axis_words(), args.all_instances)
    return 1 if args.check and report["drift"] else 0   # --check: drift is a problem found


def plan_report(args, cfg: dict) -> tuple[int, dict | None]:
    """``waypost plan``'s report (the next run's jobs, what waits, the done
    stages that drifted), from a dry run with the command's profile and
    Snakemake arguments, narrowed to its ``--experiment`` and
    ``--instance``; (the dry run's exit code, None) when it failed, having
    printed why."""
    from waypost.ops import owndrift, plan

    extra = extra_args(args)
    wconfig.check_names(cfg, experiments=args.experiment, stages=stage_args(extra))
    reach(cfg["root"])
    # (with no Snakemake arguments of the user's, the dry run reads the workflow as this
    # command's facts did: what it records serves the next plan without a reading of its own)
    reading = None if extra else graph.invocation(args.config, snakemake_profile(args),
                                                  getattr(args, "workflow_profile", None))
    code, text, found = plan.dry_run(args.profile, args.config, args.workflow,
                                     [*stores.snakemake_options(cfg["root"]), *with_profile_config(args.profile, extra)],
                                     reading)
    if code != 0:
        print(text[-4000:], file=sys.stderr)
        print("waypost: the dry run failed (above)", file=sys.stderr)
        return code, None
    axis = wconfig.derived(cfg).axis
    rows = plan.next_run(plan.parse_jobs(found, axis.word if axis else "pair"), cfg)
    waiting = plan.reuse_held(found)   # (reused stages not in this run: their source is on its way elsewhere)
    if args.instance:
        rows = _only_instances(args, cfg, rows)
    drifted, code_unknown = plan.drift(cfg, graph.code_versions(), workflow_facts(args)["funnels"], args.instance,
                                       owndrift.now_of(found))
    if args.experiment:   # (the dry run plans them all: what it shows is narrowed)
        rows = [r for r in rows if r["experiment"] in args.experiment]
        drifted = [r for r in drifted if r["experiment"] in args.experiment]
    return 0, {"next_run": rows, "waiting": waiting, "drift": drifted, "drift_groups": plan.collapse(drifted, cfg),
               "code_unknown": code_unknown,
               "input_edits": inputdrift.advice(drifted, cfg)}   # (inputs outside the root edited since: what to run)


def _only_instances(args, cfg: dict, rows: list[dict]) -> list[dict]:
    """The next run's rows of the instances ``--instance`` names (each name
    checked against the instances on disk and those the run would make)."""
    from waypost.ops import plan

    found = instances_on_disk(cfg, workflow_facts(args))   # stage → its instances
    for r in rows:
        found.setdefault(r["stage"], set()).update(r["instances"])
    wconfig.check_instance_names(cfg, args.instance, None, found)
    return plan.only_instances(rows, lambda names: wconfig.match_instances(args.instance, names))


def instances_on_disk(cfg: dict, facts: dict) -> dict[str, set[str]]:
    """The names of the instance directories of the workflow's stages with
    instances, in every experiment, stage by stage (one listing of each
    stage directory)."""
    tree = stores.store_for(cfg["root"], snapshot=True)
    found: dict[str, set[str]] = {}
    for experiment, spec in cfg["experiments"].items():
        for pair in [*spec["pairs"], layout.ALL_PAIRS]:
            for stage in facts.get("instanced") or []:
                stage_dir = layout.stage_dir(cfg["root"], pair, experiment, stage)
                if tree.isdir(stage_dir):
                    found.setdefault(stage, set()).update(name for name, _ in tree.state_dirs(stage_dir)
                                                          if name is not None)
    return found


def cmd_run(args) -> int:
    """Snakemake up to a stage, for some experiments and pairs."""
    cmd = [sys.executable, "-m", "snakemake", "-s", graph.snakefile_in(args.workflow), "--profile", args.profile]
    if args.config:
        cmd += ["--configfile", args.config]
    cfg = load_config(args)
    extra = extra_args(args)
    wconfig.check_names(cfg, args.experiment, args.pair, [*(args.until or []), *stage_args(extra)])
    reach(cfg["root"])
    cmd += stores.snakemake_options(cfg["root"])
    if args.until:
        cmd += ["--until", *args.until]
    select = {k: v for k, v in (("experiments", args.experiment), ("pairs", args.pair)) if v}
    cmd += with_profile_config(args.profile, extra, select)
    print("waypost: " + " ".join(shlex.quote(c) for c in ["snakemake", *cmd[3:]]), file=sys.stderr)
    sys.stdout.flush()
    os.execv(cmd[0], cmd)


def cmd_cron(args) -> int:
    from waypost.ops import cron
    extra = extra_args(args)
    if stage_args(extra):
        wconfig.check_names(load_config(args), stages=stage_args(extra))
    extra = with_profile_config(args.profile, extra) if args.profile else extra
    return cron.run(args.profile, extra, args.config, args.workflow, checksums=not args.no_checksums,
                    workflow_profile=args.workflow_profile)
