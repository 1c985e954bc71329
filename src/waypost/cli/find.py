"""``waypost find``: the stages that exist in every root of the catalog (a
table, JSON, their lineage or one HTML page), and ``waypost reuse``, which
points an experiment at another's stages."""

from __future__ import annotations

import json
import os
import shlex
import sys
from datetime import UTC

from waypost import stores
from waypost.cli import status as clistatus
from waypost.cli import termwidth
from waypost.cli.args import config_file, load_config, reach, workflow_facts
from waypost.model import config as wconfig
from waypost.model import graph, layout


def cmd_find(args) -> int:
    from waypost.ops import catalog

    cfg = load_config(args)
    cat = catalog.Catalog(args.db)
    roots = catalog.roots_of(cfg) + (args.root or [])
    unread = 0 if args.no_refresh else _refresh(cat, roots)
    if args.lineage:
        return render_lineage(cat.lineage(args.lineage), args.json) or (1 if unread else 0)
    rows = _found(args, cfg, cat)
    if args.html:
        # The page is over the whole catalog (lineage needs every stage); the
        # filters given here are its first view.
        everything = cat.find(archived=not args.no_archived)
        _compare_with_config(everything, cfg, args.against)
        _write_find_page(args, cfg, roots, everything)
    else:
        _compare_with_config(rows, cfg, args.against)
        if args.json:
            json.dump(rows, sys.stdout, indent=2)
            sys.stdout.write("\n")
        else:
            termwidth.console(args.width).print(_find_table(rows, roots))
    return 1 if unread else 0


def _refresh(cat, roots: list[str]) -> int:
    """The catalog brought up to date with each root (roots it no longer
    has forgotten); how many roots could not be read (each said)."""
    unread = 0
    cat.forget_others(roots)
    for root in roots:
        try:
            reach(root)
            done = cat.refresh(root)
        except Exception as exc:
            print(f"waypost: catalog: {exc}", file=sys.stderr)
            unread += 1
            continue
        for problem in done.problems:
            print(f"waypost: catalog: skipped {problem}", file=sys.stderr)
    return unread


def _found(args, cfg: dict, cat) -> list[dict]:
    """The catalog's rows find's filters select; a name that matches
    nothing anywhere is a ConfigError (a typo, said as one)."""
    if args.stage and "/" in args.stage:   # stage/instance, as the tables show them
        args.stage, instance = args.stage.split("/", 1)
        args.instance = [*(args.instance or []), instance]
    elif args.stage and args.stage.endswith("]") and "[" in args.stage:   # rule[name=value, ...]: a job
        args.stage, instance = _job_named(args.stage)
        args.instance = [*(args.instance or []), *([instance] if instance else [])]
    rows = cat.find(stage=args.stage, pair=args.pair, experiment=args.experiment, state=args.state,
                    since=args.since, until=args.until, config_hash=args.config_hash, limit=args.limit,
                    archived=not args.no_archived, instance=args.instance)
    if not rows:
        _check_find_names(cfg, cat, args)
    if args.instance:   # each: one that is nowhere is a typo, whatever the others found
        wconfig.check_instance_names(cfg, args.instance, args.experiment if args.experiment in cfg["experiments"]
                                     else None, cat.instances())
    return rows


def _find_table(rows: list[dict], roots: list[str]):
    """find's table: a row per stage found, newest first."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"{len(rows)} stage(s) found in {len(roots)} root(s), newest first", title_justify="left",
                  box=box.SIMPLE_HEAD)
    locations = [stores.shown(r["location"]) for r in rows]
    stages = [escape(row_name(r)) for r in rows]
    # (a job of a rule in its own layout has no pair: its rule's jobs are in every one)
    pairs = [None if r.get("wildcards") is not None else r["pair"] for r in rows]
    widths = {"stage": max(map(len, stages), default=5), "created": 16, "config": 8, "state": 5}
    columns = ("experiment", "pair", "stage", "state", "created", "att.", "config", "vs current config", "location")
    with_pairs = any(pair is not None for pair in pairs)
    for column in columns if with_pairs else [c for c in columns if c != "pair"]:
        table.add_column(column, overflow="fold", min_width=widths.get(column))
    for row, location, name, pair in zip(rows, locations, stages, pairs):
        text, style = clistatus.label({"state": "adopted" if row["adopted"] else row["state"]})
        table.add_row(row["experiment"], *([pair or ""] if with_pairs else []), name,
                      f"[{style}]{text}[/]" + (" (reused)" if row["reused_from"] else "")
                      + (f" (archived {row['archive']})" if row["archive"] else ""),
                      clistatus.when(row["source_created"] or row["created"]) + (" (reused)" if row["source_created"] else ""),
                      str(row["attempts"]),
                      (row["config_hash"] or "–")[:8], escape(_differs_text(row)), escape(location))
    return table


def row_name(row: dict) -> str:
    """How find names a row: a job of a rule in its own layout as Snakemake
    names it (``rule[name=value, ...]``), a stage as ``stage[/instance]``."""
    if row.get("wildcards") is not None:
        return layout.job_name(row["stage"], row["wildcards"])
    return row["stage"] + (f"/{row['instance']}" if row.get("instance") else "")


def _job_named(name: str) -> tuple[str, str | None]:
    """(rule, record name) of a job named as find shows it: ``rule[name=value, ...]``."""
    rule, inside = name[:-1].split("[", 1)
    values = {}
    for item in filter(None, (part.strip() for part in inside.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise wconfig.ConfigError(f"--stage {name}: write a job as RULE[NAME=VALUE, ...], as find shows it")
        values[key.strip()] = value.strip()
    return rule, layout.job_instance(values)


def _differs_text(row: dict) -> str:
    """A row's "vs current config" cell: what differs, and from which experiment's settings."""
    if row["differs"] is None:
        return "–"
    return ("same" if not row["differs"] else "; ".join(row["differs"])) + f" ({row['compared_with']})"


def _compare_with_config(rows: list[dict], cfg: dict, against: str | None) -> None:
    """Each row's settings that differ from the current config's (``differs``,
    ``compared_with``): of ``against``, else of its own experiment, else of
    one that has its pair; None where nothing compares."""
    from waypost.model import diffs

    settings_of = wconfig.step_settings_of(cfg)
    for row in rows:
        other = against or (row["experiment"] if row["experiment"] in cfg["experiments"] else
                            next((e for e, x in cfg["experiments"].items() if row["pair"] in x["pairs"]), None))
        if other and row["stage"] in cfg["stages"] and (row["pair"] in cfg["experiments"][other]["pairs"]
                                                        or row["pair"] == "_all"):
            current = settings_of(other, row["pair"], row["stage"], row.get("instance"))
            row["differs"] = diffs.settings_diff(row["settings"], current)
            row["compared_with"] = other
        else:
            row["differs"], row["compared_with"] = None, None


def render_lineage(tree: dict, as_json: bool) -> int:
    """``find --lineage``: the tree of manifests a stage was made from, one
    line each, indented under the stage that read it; a stage read by many
    shows its inputs once (later: "inputs above"). 1 when the stage itself
    is not in the catalog."""
    if as_json:
        json.dump(tree, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 1 if tree.get("missing") else 0
    shown: set[str] = set()

    def where(location: str) -> str:
        return os.path.relpath(location) if location and location.startswith(os.getcwd() + os.sep) else location

    def walk(node: dict, depth: int) -> None:
        lead = "  " * depth + ("reused from " if node.get("via") == "reuse" else "")
        if node.get("missing"):
            print(f"{lead}{where(node['location'])}: not in the catalog")
            return
        if node.get("adopted"):
            print(f"{lead}{where(node['location'])}: placed by hand (no manifest)")
            return
        name = (f"{node['experiment']}/{layout.job_name(node['stage'], node['wildcards'])}"
                if node.get("wildcards") is not None else
                "/".join(x for x in (node["pair"], node["experiment"], node["stage"], node["instance"]) if x))
        state = clistatus.label({"state": node["state"]})[0] + (f" (archived {node['archive']})" if node["archive"] else "")
        made = (f"made {clistatus.when(node['source_created'])} (reused)" if node.get("source_created")
                else f"made {clistatus.when(node['created'])}")
        again = node["location"] in shown and node["inputs"]
        print(f"{lead}{name}: {state}, {made}, config {(node['config_hash'] or '–')[:8]}, code "
              f"{node['code_version'] or '–'}" + (" (cycle)" if node.get("cycle") else "")
              + (" (inputs above)" if again else "") + f" — {where(node['location'])}")
        if again:
            return
        shown.add(node["location"])
        for child in node["inputs"]:
            walk(child, depth + 1)

    walk(tree, 0)
    return 1 if tree.get("missing") else 0


def _write_find_page(args, cfg: dict, roots: list[str], rows: list[dict]) -> None:
    """``find --html FILE``: the rows found, as one self-contained page (findpage)."""
    from datetime import datetime

    from waypost.cli import findpage

    # The stage graph as the last parse here recorded it (no parse of the workflow just for the page).
    parents = graph.load(workflow_facts(args)) if os.path.exists(graph.GRAPH_FILE) else None
    filters = {k: getattr(args, k) for k in ("stage", "pair", "experiment", "state", "since", "until", "config_hash")}
    data = findpage.build(rows, root=stores.absolute(cfg["root"]),
                          experiments={name: list(x["pairs"]) for name, x in cfg["experiments"].items()},
                          parents=parents, roots=[stores.absolute(r) for r in roots],
                          filters=filters, generated=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"))
    with open(args.html, "w", encoding="utf-8") as f:
        f.write(findpage.render(data))
    print(f"wrote {args.html}: {len(rows)} stage(s) from {len(roots)} root(s)")


def _check_find_names(cfg: dict, cat, args) -> None:
    """When ``find`` found nothing: a plain name (no shell pattern) that is
    neither configured nor in any root of the catalog is a typo, and gets
    the answer every command gives. Only then: the catalog spans other roots
    and older configs, so a name the config lacks may still be found."""
    for field, kind in (("experiment", "experiments"), ("pair", "pairs"), ("stage", "stages")):
        name = getattr(args, field)
        if name is None or any(c in name for c in "*?[") or cat.find(**{field: name}, limit=1):
            continue
        if field == "pair":   # not narrowed by --experiment: that may name another root's experiment
            wconfig.check_names(cfg, pairs=name)
        else:
            wconfig.check_names(cfg, **{kind: name})



def _own_pointers(cfg: dict, args) -> tuple[dict, list[str]]:
    """``reuse`` entries for a rule in its own layout: every rule upstream of
    it, found from the source experiment's records (``steer.own_upstream``),
    taken from that experiment (a record directory under another root for
    ``--from-root``, which reuse maps job by job)."""
    from waypost.ops import steer
    if args.pairs:
        raise wconfig.ConfigError(f"rule {args.upstream_of} is in its own layout: its jobs have no "
                                  f"{wconfig.axis_words(cfg)[0]}s to choose (leave out the option)")
    root = args.from_root or cfg["root"]
    rules, problems = steer.own_upstream(root, args.source, args.upstream_of)
    if not rules and not problems:
        raise wconfig.ConfigError(f"rule {args.upstream_of}: its jobs in experiment {args.source} read nothing "
                                  "another recorded job made: nothing upstream to reuse")
    return {rule: layout.stage_dir(root, layout.ALL_PAIRS, args.source, rule) if args.from_root else args.source
            for rule in rules}, problems


def cmd_reuse(args) -> int:
    from waypost.state import reuse

    cfg = load_config(args)
    # NEW must be configured (add experiments.NEW with its pairs first); OLD
    # need not be: any experiment with stage directories under the root will do.
    wconfig.check_names(cfg, args.into, args.pairs, args.upstream_of)
    reach(args.from_root or cfg["root"])
    facts = workflow_facts(args)
    if graph.named_by_wildcards(facts, args.upstream_of):
        entries, problems = _own_pointers(cfg, args)
    else:
        entries, problems = reuse.pointers(cfg, graph.parents(facts), args.into, args.source, args.upstream_of,
                                           args.pairs, args.from_root)
    if problems:
        print(f"waypost: can't reuse from experiment {args.source} (nothing written): these stages are not "
              "finished:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    configfile = config_file(args)
    if configfile is None:
        raise wconfig.ConfigError("the workflow reads no config file, and the reuse pointers go beside it: "
                                  "give the pipeline a config file (configfile: in the Snakefile, or --config FILE)")
    path = os.path.join(wconfig.reuse_dir(configfile), f"{args.into}.yaml")
    reuse.write_pointers(path, args.into, entries, "waypost " + shlex.join(sys.argv[1:]))
    print(f"wrote {os.path.relpath(path)}: experiment {args.into} takes {len(entries)} stage(s) from "
          f"{args.source}: {', '.join(entries)}")
    print(f"the next run computes {args.upstream_of} and what follows it")
    return 0
