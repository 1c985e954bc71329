"""The commands that change or check the stage directories in place:
``waypost rerun``, ``retry``, ``adopt``, ``prune`` and ``verify``."""

from __future__ import annotations

import os
import sys

from waypost import stores
from waypost.cli.args import load_config, reach, workflow_facts
from waypost.model import config as wconfig
from waypost.model import graph, layout


def _shown(path: str) -> str:
    """A stage dir as the steering commands print it: relative when local."""
    return stores.shown(path)


def cmd_rerun(args) -> int:
    from waypost.ops import steer

    cfg = load_config(args)
    if args.drifted:
        code, done, why = _drifted(args, cfg)
        if done is None:
            return code
    else:
        if not args.stage:
            raise wconfig.ConfigError("rerun: name the STAGE to rerun, or give --drifted (what `waypost plan` "
                                      "finds drifted)")
        wconfig.check_names(cfg, args.experiment, args.pair, args.stage)
        if not (args.experiment or args.pair or args.instance or args.all) and len(cfg["experiments"]) > 1:
            raise wconfig.ConfigError(f"rerun {args.stage}: the config has {len(cfg['experiments'])} experiments "
                                      f"({', '.join(cfg['experiments'])}); say which with --experiment, --pair or "
                                      f"--instance, or rerun it in all of them with --all")
        reach(cfg["root"])
        done, why = steer.rerun(cfg, args.stage, args.experiment, args.pair, args.instance, args.downstream,
                                args.dry_run), {}
    _say_rerun(cfg, done, why, args.dry_run)
    return 0


def _drifted(args, cfg: dict) -> tuple[int, list | None, dict[str, str]]:
    """``rerun --drifted``: the done stages ``plan`` finds drifted (of
    ``STAGE``, ``--experiment``, ``--pair``, ``--instance`` when given),
    archived; (the plan's dry run's exit code, None, {}) when it failed."""
    from waypost.cli.run import plan_report
    from waypost.ops import steer

    wconfig.check_names(cfg, args.experiment, args.pair, args.stage)
    code, report = plan_report(args, cfg)
    if report is None:
        return code, None, {}
    rows = [r for r in report["drift"] if (not args.stage or r["stage"] == args.stage)
            and (not args.pair or r["pair"] in args.pair)]
    tree = stores.store_for(cfg["root"], quiet=True)
    why = {tree.key(row["stage_dir"]): "; ".join(row.get("what") or []) for row in rows}
    if not rows:
        print("nothing drifted: every done stage" + (f" of {args.stage}" if args.stage else "")
              + " was made with the current settings, code and inputs")
        return 0, [], {}
    return 0, steer.rerun_dirs(cfg, list(why), args.downstream, args.dry_run), why


def _say_rerun(cfg: dict, done: list, why: dict[str, str], dry_run: bool) -> None:
    from waypost.ops import steer

    if not done:
        return
    reused = steer.reuse_sources(cfg, [directory for directory, _, _ in done])
    for directory, archived, _ in done:
        note = (f" (reused: the next run copies it again from {_shown(reused[directory])}, "
                "it does not recompute it)") if directory in reused else ""
        drifted = f" (drifted: {why[directory]})" if why.get(directory) else ""
        print(f"{_shown(directory)}: {'would be archived' if dry_run else 'archived in ' + archived}{drifted}{note}")
    own = [directory for directory, _, own_layout in done if own_layout]
    verb = "would be redone" if dry_run else "will be redone by the next run"
    if own:   # (their outputs are where their rule puts them: Snakemake remakes a deleted file only where needed)
        verb = "would be archived" if dry_run else "archived"
    print(f"{len(done)} stage(s) {verb}" + (f", {len(reused)} of them taken again from their reuse source"
                                           if reused else ""))
    if own:
        print(f"{len(own)} of them are jobs of rules in their own layout: their outputs "
              f"{'would go' if dry_run else 'went'} into the archive too, and the next run remakes "
              "them where a target or a job that runs needs them, as plain Snakemake remakes deleted files "
              "(--downstream: what used them too; `snakemake FILE`: one alone)")


def cmd_retry(args) -> int:
    """A new count of series for stages given up or waiting out a backoff."""
    from waypost.ops import steer

    cfg = load_config(args)
    wconfig.check_names(cfg, args.experiment, args.pair, args.stage)
    reach(cfg["root"])
    done = steer.retry(cfg, args.stage, args.experiment, args.pair, args.instance, args.dry_run)
    for directory, what, then in done:
        print(f"{_shown(directory)}: {what}; {'would get' if args.dry_run else 'gets'} a new count of series; "
              f"the next run: {then}")
    print(f"{len(done)} stage(s) {'would be' if args.dry_run else 'will be'} tried again by the next run "
          "(their history kept)")
    return 0


def cmd_adopt(args) -> int:
    from waypost.ops import adopt

    cfg = load_config(args)
    wconfig.check_names(cfg, args.experiment, args.pair, args.stage, allow_all_pairs=True)
    facts = workflow_facts(args)
    if graph.named_by_wildcards(facts, args.stage):
        return _adopt_own(cfg, args, facts)
    if args.wildcards:
        raise wconfig.ConfigError(f"adopt {args.stage}: --wildcards is for a rule in its own layout; a stage's "
                                  "job is its experiment, pair and --instance")
    reach(cfg["root"])
    record, replaced = adopt.adopt(cfg, args.stage, args.experiment, args.pair, args.instance, args.note, args.force)
    print(f"adopted {len(record['outputs'])} file(s) as {args.experiment}/{args.pair}/{args.stage}"
          f"{'/' + args.instance if args.instance else ''}: " + ", ".join(o["path"] for o in record["outputs"]))
    if replaced:
        print(_set_aside(replaced))
    return 0


def _adopt_own(cfg: dict, args, facts: dict) -> int:
    """``adopt`` of a job of a rule in its own layout, named by its wildcards (``ops.adopt``)."""
    from waypost.ops import adopt

    patterns = (facts.get("own_outputs") or {}).get(args.stage)
    if patterns is None:
        raise wconfig.ConfigError(f"adopt {args.stage}: the last reading of the workflow here recorded no outputs "
                                  "for it; run `snakemake -n` once, then adopt")
    if args.instance or args.pair != layout.ALL_PAIRS:
        raise wconfig.ConfigError(f"adopt {args.stage}: a rule in its own layout: name its job by --wildcards "
                                  "NAME=VALUE ..., not --instance or a pair; nothing was changed")
    given = {}
    for item in args.wildcards or []:
        name, equals, value = item.partition("=")
        if not equals or not name:
            raise wconfig.ConfigError(f"adopt {args.stage}: --wildcards {item!r}: write NAME=VALUE")
        given[name] = value
    reach(cfg["root"])
    record, record_dir, replaced = adopt.adopt_own(cfg, args.stage, args.experiment, given, patterns,
                                                   args.note, args.force)
    print(f"adopted {len(record['outputs'])} file(s) as the job {args.stage}"
          + (f"[{', '.join(f'{k}={v}' for k, v in record['wildcards'].items())}]" if record["wildcards"] else "")
          + f" of experiment {record['experiment']}: "
          + ", ".join(stores.shown(stores.resolve(record_dir, os.path.join(record["outputs_dir"], o["path"])))
                      for o in record["outputs"]) + f" (its record: {record_dir})")
    if replaced:
        print(_set_aside(replaced))
    return 0


def _set_aside(replaced: dict) -> str:
    """What adopt archived: ``the earlier manifest (SUCCESS, made …) and
    its logs archived in DIR/.attempts/N``."""
    from waypost.cli import status as clistatus

    earlier, rest = replaced["manifest"], [e for e in replaced["entries"] if e != layout.MANIFEST]
    if earlier and layout.MANIFEST in replaced["entries"]:
        what = (f"the earlier manifest ({earlier['state']}{', adopted' if earlier.get('adopted') else ''}, "
                f"made {clistatus.when(earlier.get('created'))})")
        what += " and its logs" if rest == [layout.LOGS] else f" with {', '.join(rest)}" if rest else ""
    else:
        what = "what was there before (" + ", ".join(replaced["entries"]) + ")"
    return f"{what} archived in {replaced['archive']}"


def cmd_prune(args) -> int:
    """Remove the archived workspaces beyond the retention that nothing needs
    (slim those only an attempt history reads)."""
    from waypost.ops import prune

    cfg = load_config(args)
    wconfig.check_names(cfg, args.experiment, args.pair, args.stage, allow_all_pairs=True)
    reach(cfg["root"])
    archives, problems = prune.prune(cfg, args.experiment, args.pair, args.stage, dry_run=args.dry_run)
    if not archives:
        print(f"no archived workspaces (.attempts/) under {cfg['root']} for this selection")
        return 0
    lines, trouble = prune.report(archives, problems, args.dry_run)
    print("\n".join(lines))
    if trouble:
        print(trouble, file=sys.stderr)
        return 1
    return 0


def cmd_verify(args) -> int:
    from waypost.state import verify
    cfg = load_config(args)
    reach(cfg["root"])
    problems = verify.verify(cfg["root"], checksums=not args.no_checksums, repair=args.repair)
    for p in problems:
        action = f"archived in {p.stage_dir}/{p.archived}" if p.archived else "not done (use --repair to set it aside)"
        print(f"{p.stage_dir}: {p.what}; {action}")
    print(f"{len(problems)} stage(s) not to be trusted" if problems else "every manifest checks out")
    how = verify.summary(problems, checksums=not args.no_checksums)
    if how:
        print(how)   # on a gs:// root: crc32c from the listing, or sizes only (and how many)
    return 1 if problems else 0   # problems found (also when --repair set them aside)
