"""The commands that hand the workflow to Snakemake: ``waypost plan`` (a
dry run: what the next run would do and why, and the done stages that
drifted), ``waypost run`` and ``waypost cron``."""

from __future__ import annotations

import json
import os
import shlex
import sys

from waypost.cli import status as clistatus
from waypost.cli import termwidth
from waypost.cli.args import (
    DEFAULT_CONFIG,
    extra_args,
    load_config,
    reach,
    stage_args,
    with_profile_config,
    workflow_facts,
)
from waypost.model import config as wconfig
from waypost.model import graph, layout
from waypost.ops import inputdrift
from waypost.stores.mirror import snakemake_options


def cmd_plan(args) -> int:
    from rich.markup import escape
    from rich.table import Table

    from waypost.ops import plan

    cfg = load_config(args)
    extra = extra_args(args)
    wconfig.check_names(cfg, stages=stage_args(extra))
    reach(cfg["root"])
    config_path = None if args.config == DEFAULT_CONFIG else args.config
    code, text, found = plan.dry_run(args.profile, config_path, args.workflow,
                              [*snakemake_options(cfg["root"]), *with_profile_config(args.profile, extra)])
    if code != 0:
        print(text[-4000:], file=sys.stderr)
        print("waypost: the dry run failed (above)", file=sys.stderr)
        return code
    rows = plan.next_run(plan.parse_jobs(found, (cfg.get(wconfig.AXIS_KEY) or {}).get("word", "pair")), cfg)
    waiting = plan.reuse_held(found)   # (reused stages not in this run: their source is on its way elsewhere)
    if args.instance:
        found = instances_on_disk(cfg, workflow_facts(args))   # stage → its instances
        for r in rows:
            found.setdefault(r["stage"], set()).update(r["instances"])
        wconfig.check_instance_names(cfg, args.instance, None, found)
        rows = plan.only_instances(rows, lambda names: wconfig.match_instances(args.instance, names))

    drifted, code_unknown = plan.drift(cfg, graph.code_versions(), workflow_facts(args)["funnels"], args.instance)
    groups = plan.collapse(drifted, cfg)
    unknown_note = (f"code version unknown (recorded before per-stage code versions): {code_unknown} done "
                    f"stage(s)" if code_unknown else "")
    drift_code = 1 if args.check and drifted else 0   # --check: drift is a problem found
    edited = inputdrift.advice(drifted, cfg)   # (inputs outside the root edited since: what to run)
    if args.json:
        json.dump({"next_run": rows, "waiting": waiting, "drift": drifted, "drift_groups": groups,
                   "code_unknown": code_unknown, "input_edits": edited}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return drift_code
    console = termwidth.console(args.width)
    axis = cfg.get("_axis")   # (a workflow without an axis: no column for it)
    if rows:
        jobs = sum(g["count"] for r in rows for g in r["reasons"])
        table = Table(title=f"next run: {jobs:,} job(s)", title_justify="left")
        named = any(r["instances"] for r in rows)   # (a column for instances when a stage has them)
        for column in ("experiment", *([axis["word"]] if axis else []), "stage", "jobs",
                       *(["instances"] if named else []), "why"):
            table.add_column(column, overflow="fold", justify="right" if column == "jobs" else "left")
        unnamed = 0
        for r in rows:   # a row per stage and reason: its jobs, and their instances when few
            for g in r["reasons"]:
                names = g["instances"]
                if len(names) > NAMED_INSTANCES and not args.all_instances:
                    unnamed += 1
                    names_text = "…"
                else:
                    names_text = ", ".join(sorted(names, key=clistatus.natural))
                table.add_row(r["experiment"], *([clistatus.pair_heading(r["pair"], axis)] if axis else []),
                              escape(r["stage"]), f"{g['count']:,}", *([escape(names_text)] if named else []),
                              escape(g["why"]))
        console.print(table)
        if unnamed:
            console.print(f"…: more than {NAMED_INSTANCES} instances; `waypost plan --all-instances` names them all")
    else:
        console.print("next run: nothing to do")
    for why in waiting:
        console.print(escape(f"not in this run: {why}; it and what needs it wait for it"), soft_wrap=True)
    titles = {"done": "done, but made with other settings, code or inputs than now "
                      "(kept in presence mode; `waypost rerun STAGE` redoes one)",
              "unfinished": "not done, and the next series goes on with work made under other settings",
              "given_up": "given up, and its settings changed since (no run tries it again until `waypost retry`)"}
    for kind, title in titles.items():
        shown = [g for g in groups if ("given_up" if g.get("given_up") else
                                       "unfinished" if g["unfinished"] else "done") == kind]
        if not shown:
            continue
        table = Table(title=title, title_justify="left")
        for column in ("experiment", *([axis["word"]] if axis else []), "stage", "made", "what differs"):
            table.add_column(column, overflow="fold")
        for g in shown:   # cells of a stage with the same differences: one row, with their count
            made = " … ".join(dict.fromkeys(m[:16].replace("T", " ") for m in g["made"]))
            table.add_row(", ".join(g["experiments"]),
                          *([", ".join(clistatus.pair_heading(p, axis) for p in g["pairs"])] if axis else []),
                          escape(g["stage"] + (f" [{_names_shown(g['instances'])}]" if g["instances"] else "")
                                 + (f" ×{g['count']}" if g["count"] > 1 else "")),
                          made + (f" (reused from {', '.join(g['reused_from'])})" if g["reused_from"] else ""),
                          escape("\n".join(g["what"])))
        console.print(table)
    for line in edited:
        console.print(escape(line), soft_wrap=True)
    if not drifted:
        console.print("no drift in settings or inputs" if code_unknown else
                      "no drift: every done stage was made with the current settings and code")
    if unknown_note:
        console.print(unknown_note)
    return drift_code


def instances_on_disk(cfg: dict, facts: dict) -> dict[str, set[str]]:
    """The names of the instance directories of the workflow's stages with
    instances, in every experiment, stage by stage (one listing of each
    stage directory)."""
    from waypost import stores

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


# `waypost plan` names the instances of a row of the next run up to this many.
NAMED_INSTANCES = 10


def _names_shown(names: list[str], shown: int = 8) -> str:
    """Instance names for a table cell: the first few, then how many more."""
    names = sorted(names, key=clistatus.natural)
    return ", ".join(names[:shown]) + (f", … +{len(names) - shown}" if len(names) > shown else "")


def cmd_run(args) -> int:
    """Snakemake up to a stage, for some experiments and pairs."""
    cmd = [sys.executable, "-m", "snakemake", "-s", os.path.join(args.workflow, "Snakefile"), "--profile", args.profile]
    if args.config != DEFAULT_CONFIG:
        cmd += ["--configfile", args.config]
    cfg = load_config(args)
    extra = extra_args(args)
    wconfig.check_names(cfg, args.experiment, args.pair, [*(args.until or []), *stage_args(extra)])
    reach(cfg["root"])
    cmd += snakemake_options(cfg["root"])
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
    return cron.run(args.profile, extra, args.config, args.workflow, checksums=not args.no_checksums)
