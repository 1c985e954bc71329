"""The ``waypost`` command: looking at and steering the file state.

Thin over the engine modules, and it never imports Snakemake unless a command
needs it (importing Snakemake with the Slurm plugin probes the controller).
Here: the parser and ``main``; the commands are in clistatus, clifind,
clirun, clisteer and clisetup, over what they share in cliargs.
"""

from __future__ import annotations

import argparse
import json
import sys

from waypost import __version__
from waypost.cli.find import cmd_find, cmd_reuse
from waypost.cli.importspec import cmd_import
from waypost.cli.run import cmd_cron, cmd_plan, cmd_run
from waypost.cli.setup import cmd_init, cmd_profiles_install, cmd_workers
from waypost.cli.status import cmd_status
from waypost.cli.steer import cmd_adopt, cmd_prune, cmd_rerun, cmd_retry, cmd_verify
from waypost.model import config as wconfig
from waypost.model import graph, layout
from waypost.model.errors import WaypostError

EXIT_CODES = """exit codes (every command):
  0  fine
  1  problems found: `verify` found stages not to be trusted (also with --repair),
     `plan --check` found drift, `rerun`/`adopt` refused (an attempt is running,
     nothing to rerun), `reuse` found unfinished source stages, a root
     (gs://) can't be reached or read (`find`: one of its roots)
  2  usage or config error: a bad option, an invalid config, an unknown
     experiment, pair or stage name (checked the same way by every command)
Once Snakemake has started, `run` exits with Snakemake's code; `cron` exits
non-zero only when the workflow could not run at all (docs/operations.md).

reference (in waypost's repository, and the manual's Reference section):
  docs/reference/cli.md     every command and option (`waypost COMMAND --help`)
  docs/reference/config.md  every config key, its default and meaning"""

#: What ``waypost COMMAND --help`` ends with.
COMMAND_EPILOG = ("all options of every command: docs/reference/cli.md; every config key, its default and "
                  "meaning: docs/reference/config.md (in waypost's repository, and the manual's Reference section)")
INSTANCE_HELP = "only this instance{} (repeatable; shell patterns work: --instance 'nu0.01-*'){}"


def _recorded_axis() -> tuple[str, str]:
    """The axis words of the workflow last read here (see graph): the
    options follow them (``--pair``, or ``--point`` in a study of points)."""
    try:
        with open(graph.GRAPH_FILE) as f:
            axis = json.load(f).get("axis") or {}
    except (OSError, ValueError, AttributeError):
        axis = {}
    return axis.get("word") or "pair", axis.get("key") or "pairs"


def build_parser() -> argparse.ArgumentParser:
    word, words = _recorded_axis()
    one = ["--pair"] + ([f"--{word}"] if word != "pair" else [])     # --pair always works too
    many = ["--pairs"] + ([f"--{words}"] if words != "pairs" else [])
    parser = argparse.ArgumentParser(prog="waypost",
                                     description="Look at and steer the file state of a waypost workflow.",
                                     epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"waypost {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    def with_config(p):
        p.add_argument("--config", default=None, help="the pipeline's config file, as snakemake's --configfile "
                       "(default: the one the Snakefile's configfile: names, else config/config.yaml, as "
                       "snakemake reads them)")
        p.add_argument("--workflow", default=None, help="the directory of the Snakefile, and of its schemas/ "
                       "(default: workflow/, or the current directory when it holds the Snakefile)")
        p.add_argument("--workflow-profile", default=None, help="as snakemake's --workflow-profile (default: "
                       "profiles/default where snakemake finds it)")
        return p

    p = with_config(sub.add_parser("status", help=f"experiments × {words} × stages, from the stage directories"))
    p.add_argument("--json", action="store_true", help="machine-readable output (indented on a terminal, one line when piped)")
    p.add_argument("--html", metavar="FILE", help="write the grid as one self-contained HTML page")
    p.add_argument("--failed", nargs="*", metavar="STAGE", help="name the stages and instances not done (of "
                   "these stages, default all), each with its state and why: its last decision's reason, given up, "
                   "a parent not accepted; not those running or not yet run")
    p.add_argument("--attempts", nargs="+", metavar="STAGE", help="the attempts of these stages: a line per "
                   "directory (instance or " + word + "): attempts, series, last state and decision; a "
                   "directory's every attempt when it is the only one (--instance NAME)")
    p.add_argument("--all-attempts", action="store_true", help="with --attempts: every attempt of every "
                   "directory, and its archived runs")
    p.add_argument("--experiment", help="only this experiment")
    p.add_argument(*one, dest="pair", help=f"only this {word} (its stages, no funnels)")
    p.add_argument("--instance", action="append", help=INSTANCE_HELP.format(" of the stages with instances", ""))
    p.add_argument("--sizes", action="store_true", help="the archived workspaces (.attempts/) of each stage: "
                   "how many, how big (walks them: only when asked)")
    p.set_defaults(func=cmd_status)

    p = with_config(sub.add_parser("workers", help="the resolved worker pool: class → resources and env"))
    p.add_argument("--profile", help="the pool this Snakemake profile selects (name or path)")
    p.add_argument("--pool", help="a pool of workers.yaml")
    p.add_argument("--json", action="store_true")
    p.add_argument("--check", action="store_true", help="compare each class of a Slurm pool with the cluster's "
                   "partitions and nodes (scontrol): time limits, CPUs, memory, GPUs, features, accounts, QOS; "
                   "exit 1 when one could never start")
    p.set_defaults(func=cmd_workers)

    p = with_config(sub.add_parser("cron", help="one locked, idempotent run of the workflow (for crontab)"))
    p.add_argument("--profile", default="local", help="Snakemake profile (default: %(default)s)")
    p.add_argument("--no-checksums", action="store_true", help="check output sizes only, not checksums")
    p.add_argument("snakemake_args", nargs=argparse.REMAINDER, help="more Snakemake arguments, after --")
    p.set_defaults(func=cmd_cron)

    p = with_config(sub.add_parser("verify", help="find stages whose manifest or outputs can't be trusted"))
    p.add_argument("--repair", action="store_true", help="archive them so the next run redoes them")
    p.add_argument("--no-checksums", action="store_true", help="check output sizes only, not checksums")
    p.set_defaults(func=cmd_verify)

    p = with_config(sub.add_parser("find", help="stages that already exist, in every root of the catalog"))
    p.add_argument("--stage", help="a stage (shell patterns work: train_*), or STAGE/INSTANCE")
    p.add_argument(*one, dest="pair", help=f"a {word} (shell patterns work)")
    p.add_argument("--experiment", help="an experiment (shell patterns work)")
    p.add_argument("--instance", action="append", help=INSTANCE_HELP.format("", "; --stage STAGE/INSTANCE works too"))
    p.add_argument("--state", help="SUCCESS, FAILED, TIMEOUT, ...")
    p.add_argument("--since", help="made at or after this UTC date/time (2026-11-01 or 2026-11-01T12:00)")
    p.add_argument("--until", help="made before this UTC date/time")
    p.add_argument("--config-hash", help="made with exactly these settings")
    p.add_argument("--against", metavar="EXPERIMENT", help="compare settings with this experiment's (default: "
                   "the stage's own experiment if configured)")
    p.add_argument("--root", action="append", help="one more root to look in (path or gs:// URI)")
    p.add_argument("--db", default=layout.CATALOG_DB, help="the catalog cache (default: %(default)s)")
    p.add_argument("--no-refresh", action="store_true", help="query the cache as it is")
    p.add_argument("--no-archived", action="store_true", help="only current manifests, not the archived "
                   "workspaces (.attempts/<n>) of earlier runs")
    p.add_argument("--lineage", metavar="STAGE_DIR", help="the manifests this stage (or instance, or archive) "
                   "directory was made from, back to the first stage, across roots and reuse")
    p.add_argument("--limit", type=int)
    p.add_argument("--width", type=int, help="table width (default: the terminal's; piped: as wide as the table)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--html", metavar="FILE", help="write what was found as one self-contained HTML page (filters, "
                   "lineage, reuse pointers; opens from a file or a bucket)")
    p.set_defaults(func=cmd_find)

    p = with_config(sub.add_parser("reuse", help="make an experiment take the stages upstream of STAGE from another"))
    p.add_argument("--into", required=True, metavar="NEW", help="the experiment that reuses")
    p.add_argument("--from", dest="source", required=True, metavar="OLD", help="the experiment reused from")
    p.add_argument("--upstream-of", required=True, metavar="STAGE", help="reuse every stage this one depends on")
    p.add_argument(*many, dest="pairs", nargs="+", help=f"only these {words} (default: all of NEW's)")
    p.add_argument("--from-root", help="OLD lives under this root (path or gs:// URI), not the pipeline's")
    p.set_defaults(func=cmd_reuse)

    p = with_config(sub.add_parser("rerun", help="archive stages so the next run computes them again"))
    p.add_argument("stage", nargs="?", help="the stage (with --drifted: only its drifted jobs)")
    p.add_argument("--drifted", action="store_true", help="the done stages `waypost plan` finds drifted (edited "
                   "settings, code, inputs outside the root): a dry run with --profile decides, as plan's does")
    p.add_argument("--profile", default="local", help="with --drifted: the Snakemake profile of the dry run "
                   "(default: %(default)s)")
    p.add_argument("--experiment", action="append", help="only this experiment (repeatable)")
    p.add_argument(*one, dest="pair", action="append", help=f"only this {word} (repeatable)")
    p.add_argument("--instance", action="append", help=INSTANCE_HELP.format(" of the stage", ""))
    p.add_argument("--all", action="store_true", help="in every experiment (needed when the config has more "
                   f"than one and no --experiment, --{word} or --instance narrows it)")
    p.add_argument("--downstream", action="store_true", help="and every stage made from their outputs (also in "
                   "experiments that reuse them)")
    p.add_argument("-n", "--dry-run", action="store_true", help="say what would be archived")
    p.set_defaults(func=cmd_rerun, snakemake_args=[])

    retry_help = ("give stages that were given up (max_series, a give_up cue) or are waiting out a "
                  "series_backoff a new count of series: the next run tries them again, beginning as the "
                  "policy's cues say (a fresh start in a new workspace, the old one archived, unless a cue "
                  "restarts or reruns)")
    p = with_config(sub.add_parser("retry", help=retry_help, description=retry_help))
    p.add_argument("stage")
    p.add_argument("--experiment", action="append", help="only this experiment (repeatable)")
    p.add_argument(*one, dest="pair", action="append", help=f"only this {word} (repeatable)")
    p.add_argument("--instance", action="append", help=INSTANCE_HELP.format(" of the stage", ""))
    p.add_argument("-n", "--dry-run", action="store_true", help="say what would be tried again")
    p.set_defaults(func=cmd_retry)

    p = with_config(sub.add_parser("adopt", help="declare files placed by hand in a stage directory done"))
    p.add_argument("stage")
    p.add_argument("--experiment", required=True)
    p.add_argument(*one, dest="pair", default="_all", help="(default: the per-experiment slot, for funnels)")
    p.add_argument("--instance", help="the instance, for a stage with instances")
    p.add_argument("--wildcards", nargs="+", metavar="NAME=VALUE",
                   help="for a rule in its own layout: the job's wildcards (its outputs are the rule's, filled)")
    p.add_argument("--note", help="why, for the record")
    p.add_argument("--force", action="store_true", help="even over a stage waypost finished itself")
    p.set_defaults(func=cmd_adopt)

    p = with_config(sub.add_parser("prune", help="remove archived workspaces (.attempts/) beyond the retention "
                                   "that nothing needs"))
    p.add_argument("-n", "--dry-run", action="store_true", help="list what would be removed, slimmed and kept, and why")
    p.add_argument("--experiment", action="append", help="only this experiment (repeatable)")
    p.add_argument(*one, dest="pair", action="append", help=f"only this {word} (repeatable; _all: the funnels)")
    p.add_argument("--stage", action="append", help="only this stage (repeatable)")
    p.set_defaults(func=cmd_prune)

    p = with_config(sub.add_parser("plan", help="what the next run would do and why; done stages that drifted"))
    p.add_argument("--profile", default="local", help="Snakemake profile (default: %(default)s)")
    p.add_argument("--check", action="store_true", help="exit 1 when a done stage drifted (for scripts and CI)")
    p.add_argument("--experiment", action="append", help="only the jobs and drift of this experiment (repeatable)")
    p.add_argument("--instance", action="append", help="only the jobs and drift of this instance (repeatable; "
                   "shell patterns work: --instance 'nu0.01-*')")
    p.add_argument("--all-instances", action="store_true", help="name every instance of the next run (by "
                   "default a row of a stage and reason names its instances when there are at most 10)")
    p.add_argument("--width", type=int, help="table width (default: the terminal's; piped: as wide as the table)")
    p.add_argument("--json", action="store_true")
    p.add_argument("snakemake_args", nargs=argparse.REMAINDER, help="more Snakemake arguments, after --")
    p.set_defaults(func=cmd_plan)

    p = with_config(sub.add_parser("run", help=f"run the pipeline, up to a stage, for some experiments and {words}"))
    p.add_argument("--profile", default="local", help="Snakemake profile (default: %(default)s)")
    p.add_argument("--until", nargs="+", metavar="STAGE", help="stop after these stages")
    p.add_argument("--experiment", action="append", help="only this experiment (repeatable)")
    p.add_argument(*one, dest="pair", action="append", help=f"only this {word} (repeatable)")
    p.add_argument("snakemake_args", nargs=argparse.REMAINDER, help="more Snakemake arguments, after --")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("init", help="write a runnable pipeline into a new directory: three stages with a "
                       "funnel, its config, a schema, scripts and a test")
    p.add_argument("directory")
    p.add_argument("--no-profiles", action="store_true", help="don't install waypost's profiles for bare names")
    p.add_argument("--profiles-target", default="~/.config/snakemake", help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_init)

    imports = sub.add_parser("import", help="write a pipeline that runs a Maestro or Merlin study spec as written")
    kinds = imports.add_subparsers(dest="kind", required=True)
    p = kinds.add_parser("maestro", help="a Maestro spec (maestro run SPEC [--pgen FILE])")
    p.add_argument("spec", help="the study's YAML spec")
    p.add_argument("--pgen", metavar="FILE", help="a parameter generator (get_custom_generator(env, **kwargs)): "
                   "its points replace global.parameters, as in Maestro")
    p.add_argument("--pargs", action="append", metavar="KEY:VALUE", help="an argument of the generator (repeatable)")
    p.add_argument("--to", default=".", metavar="DIR", help="where to write workflow/Snakefile and config/ "
                   "(default: here; nothing there is overwritten)")
    p.set_defaults(func=cmd_import)
    p = kinds.add_parser("merlin", help="a Merlin spec (merlin run SPEC)")
    p.add_argument("spec", help="the study's YAML spec")
    p.add_argument("--samples", metavar="FILE", help="the samples (.csv, .npy, whitespace-separated), instead "
                   "of merlin.samples.file (Merlin's --samplesfile)")
    p.add_argument("--to", default=".", metavar="DIR", help="where to write workflow/Snakefile and config/ "
                   "(default: here; nothing there is overwritten)")
    p.set_defaults(func=cmd_import)

    profiles = sub.add_parser("profiles", help="Snakemake profiles").add_subparsers(dest="action", required=True)
    p = profiles.add_parser("install", help="make waypost's profiles usable by bare name (--profile local): "
                            "copies of the installed package's, the same from any directory")
    p.add_argument("--target", default="~/.config/snakemake", help="where Snakemake looks (default: %(default)s)")
    p.set_defaults(func=cmd_profiles_install)
    for command in _commands(parser):
        command.epilog = command.epilog or COMMAND_EPILOG
    return parser


def _commands(parser: argparse.ArgumentParser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command in action.choices.values():
                yield command
                yield from _commands(command)


def main(argv: list[str] | None = None) -> int:
    import signal
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `waypost find --json | head` ends quietly
    args = build_parser().parse_args(argv)
    if getattr(args, "workflow", "") is None:
        args.workflow = graph.default_workflow_dir()
    from waypost import stores
    stores.quiet_client_logging()
    try:
        return args.func(args)
    except WaypostError as exc:  # a mistake or fault waypost recognised: its one line (anything else is a bug)
        print(f"waypost: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, wconfig.ConfigError) else 1


if __name__ == "__main__":
    sys.exit(main())
