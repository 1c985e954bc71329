"""The ``waypost`` command: looking at and steering the file state.

Thin over the engine modules, and it never imports Snakemake unless a command
needs it (importing Snakemake with the Slurm plugin probes the controller).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from . import __version__
from . import config as wconfig

def load_config(args) -> dict:
    return wconfig.load(args.config, args.workflow)


def cmd_status(args) -> int:
    from . import status

    cfg = load_config(args)
    grid = status.collect(cfg, wconfig.experiment_scoped_stages(args.workflow))
    if args.attempts:
        render_attempts(grid, args.attempts, args.experiment, args.pair)
        return 0
    if args.json:
        json.dump(grid, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    if args.html:
        from . import statuspage
        with open(args.html, "w", encoding="utf-8") as f:
            f.write(statuspage.render(grid))
        print(f"wrote {args.html}")
        return 0
    render_status(grid)
    return 0


def _label(cell: dict) -> tuple[str, str]:
    from . import status

    text, attempts = status.label(cell)
    return text + (f" ×{attempts}" if attempts > 1 else ""), status.look(cell["state"])[1]


def render_status(grid: dict) -> None:
    """One table per experiment: a row per stage, a column per pair; a legend."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from . import status

    console = Console()
    for experiment, columns in grid["experiments"].items():
        table = Table(title=f"experiment [bold]{experiment}[/]  (root {grid['root']})", title_justify="left")
        table.add_column("stage", style="bold")
        for pair in columns:
            table.add_column("all pairs" if pair.startswith("_") else pair)
        for stage in grid["stages"]:
            cells = [Text(*_label(col[stage])) if stage in col else Text("") for col in columns.values()]
            table.add_row(stage, *cells)
        console.print(table)
    lines = [Text("  ").join(Text(*status.look(state)[:2]) for state in group)
             for group in (status.LOOKS, status.FAILURES)]
    console.print(Text("legend: ") + Text("\n        ").join([*lines, Text(status.LEGEND_MARKS)]))


def _stage_cells(grid: dict, stage: str, experiment: str | None, pair: str | None):
    for exp, columns in grid["experiments"].items():
        if experiment and exp != experiment:
            continue
        for p, cells in columns.items():
            if (pair and p != pair) or stage not in cells:
                continue
            cell = cells[stage]
            for name, sub in (cell.get("instances") or {None: cell}).items():
                yield exp, p, name, sub


def render_attempts(grid: dict, stages: list[str], experiment: str | None, pair: str | None) -> None:
    """The attempt history of some stages: action, state, exit, checks, decision."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    for stage in stages:
        if stage not in grid["stages"]:
            raise wconfig.ConfigError(f"unknown stage {stage!r} (expected one of: {', '.join(grid['stages'])})")
        for exp, p, instance, cell in _stage_cells(grid, stage, experiment, pair):
            where = "/".join(x for x in (p if not p.startswith("_") else "all pairs", exp, stage, instance) if x)
            table = Table(title=f"{where}: {_label(cell)[0]}" + (f" — {cell['reason']}" if cell.get("reason") else ""),
                          title_justify="left")
            series = len({a.get("series", 1) for a in cell.get("history", [])}) > 1
            columns = ["#"] + (["series"] if series else []) + ["action", "state", "exit", "checks", "next",
                                                               "secs", "log"]
            for column in columns:
                table.add_column(column, overflow="fold")
            for a in cell.get("history", []):
                exit_text = f"sig {a['signal']}" if a.get("signal") else str(a.get("exit_code", ""))
                checks = " ".join(f"{k}:{'ok' if v == 'SUCCESS' else v}" for k, v in (a.get("checks") or {}).items())
                row = [str(a["number"])] + ([str(a.get("series", 1))] if series else [])
                row += [a.get("action", ""), a.get("state") or "?", exit_text, checks,
                        (a.get("decision") or {}).get("action", ""), f"{a.get('duration_s') or 0:.1f}",
                        a.get("log") or ""]
                table.add_row(*row)
            console.print(table)


PROFILE_MARK = ".waypost-profile"


def _is_waypost_link(path: str) -> bool:
    """A link this command made earlier: dangling, or into a waypost profile
    (one holding the mark file), possibly of another checkout."""
    if not os.path.islink(path):
        return False
    return not os.path.exists(path) or os.path.exists(os.path.join(path, PROFILE_MARK))


def cmd_profiles_install(args) -> int:
    """Link the repo's profiles where Snakemake looks for bare names."""
    source_dir = os.path.abspath(args.source)
    target_dir = os.path.expanduser(args.target)
    os.makedirs(target_dir, exist_ok=True)
    for name in sorted(os.listdir(source_dir)):
        source = os.path.join(source_dir, name)
        if not os.path.isdir(source):
            continue
        target = os.path.join(target_dir, name)
        if os.path.islink(target) and os.path.realpath(target) == os.path.realpath(source):
            print(f"profile {name}: already installed ({target})")
            continue
        if _is_waypost_link(target):
            os.unlink(target)  # ours, from another (or a deleted) checkout
        elif os.path.lexists(target):
            print(f"profile {name}: {target} exists and is not waypost's; left alone "
                  f"(use --profile {os.path.relpath(source)} instead)", file=sys.stderr)
            continue
        os.symlink(source, target)
        print(f"profile {name}: installed {target} -> {source}")
    return 0


def _profile_pool(profile: str) -> str | None:
    """The pool a Snakemake profile selects (its ``config: [pool=...]``)."""
    candidates = [profile, os.path.join("profiles", profile), os.path.expanduser(f"~/.config/snakemake/{profile}"),
                  f"/etc/xdg/snakemake/{profile}"]
    for directory in candidates:
        path = os.path.join(directory, "config.yaml")
        if os.path.exists(path):
            entries = wconfig.load_yaml(path).get("config") or []
            for entry in entries if isinstance(entries, list) else [entries]:
                key, _, value = str(entry).partition("=")
                if key.strip() == "pool":
                    return value.strip().strip("'\"")
            return None
    raise wconfig.ConfigError(f"profile {profile!r} not found (looked in {', '.join(candidates)})")


def cmd_workers(args) -> int:
    """The resolved pool table: class → partition, GPUs, CPUs, memory, runtime, env."""
    from rich.console import Console
    from rich.table import Table

    from . import workers

    cfg = load_config(args)
    pool = args.pool or (args.profile and _profile_pool(args.profile)) or cfg["pool"]
    path = cfg["workers"]
    data = workers.load(path)
    if pool not in data["pools"]:
        raise wconfig.ConfigError(f"{path}: no pool {pool!r} (expected one of: {', '.join(data['pools'])})")
    spec = data["pools"][pool]
    rows = {name: {**workers.resources(cls), "env": cls.get("env", {})} for name, cls in spec["classes"].items()}
    if args.json:
        json.dump({"pool": pool, "executor": spec["executor"], "classes": rows}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    table = Table(title=f"pool [bold]{pool}[/] ({spec['executor']}, from {path})", title_justify="left")
    extras = {name: " ".join(f"{k}={r[k]}" for k in ("constraint", "slurm_account", "qos", "slurm_extra") if r.get(k))
              for name, r in rows.items()}
    columns = ["class", "partition", "GPUs", "CPUs", "memory", "runtime"] + (["other"] if any(extras.values()) else [])
    for column in columns + ["env"]:
        table.add_column(column)
    for name, r in rows.items():
        gpus = r.get("gres") or (f"{r.get('gpu', 0)}" + (f" × {r['gpu_model']}" if r.get("gpu_model") else "")
                                 if r.get("gpu") else "–")
        cells = [name, r.get("slurm_partition", "–"), gpus, str(r.get("cpus_per_task", "–")),
                 f"{r['mem_mb']} MB" if r.get("mem_mb") else "–", f"{r['runtime']} min" if r.get("runtime") else "–"]
        if "other" in columns:
            cells.append(extras[name])
        table.add_row(*cells, " ".join(f"{k}={v}" for k, v in r["env"].items()))
    Console().print(table)
    return 0


def cmd_cron(args) -> int:
    from . import cron
    extra = args.snakemake_args[1:] if args.snakemake_args[:1] == ["--"] else args.snakemake_args
    return cron.run(args.profile, extra, args.config, args.workflow, checksums=not args.no_checksums)


def cmd_verify(args) -> int:
    from . import verify
    cfg = load_config(args)
    problems = verify.verify(cfg["root"], checksums=not args.no_checksums, repair=args.repair)
    for p in problems:
        action = f"archived in {p.stage_dir}/{p.archived}" if p.archived else "not done (use --repair to set it aside)"
        print(f"{p.stage_dir}: {p.what}; {action}")
    print(f"{len(problems)} stage(s) not to be trusted" if problems else "every manifest checks out")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="waypost", description="Look at and steer the file state of a waypost workflow.")
    parser.add_argument("--version", action="version", version=f"waypost {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    def with_config(p):
        p.add_argument("--config", default="config/config.yaml", help="config file (default: %(default)s)")
        p.add_argument("--workflow", default="workflow", help="workflow dir with schemas/ (default: %(default)s)")
        return p

    p = with_config(sub.add_parser("status", help="experiments × pairs × stages, from the stage directories"))
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--html", metavar="FILE", help="write the grid as one self-contained HTML page")
    p.add_argument("--attempts", nargs="+", metavar="STAGE", help="list the attempt history of these stages")
    p.add_argument("--experiment", help="with --attempts: only this experiment")
    p.add_argument("--pair", help="with --attempts: only this pair")
    p.set_defaults(func=cmd_status)

    p = with_config(sub.add_parser("workers", help="the resolved worker pool: class → resources and env"))
    p.add_argument("--profile", help="the pool this Snakemake profile selects (name or path)")
    p.add_argument("--pool", help="a pool of workers.yaml")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_workers)

    p = with_config(sub.add_parser("cron", help="one locked, idempotent run of the workflow (for crontab)"))
    p.add_argument("--profile", default="local", help="Snakemake profile (default: %(default)s)")
    p.add_argument("--no-checksums", action="store_true", help="check output sizes only, not sha256")
    p.add_argument("snakemake_args", nargs=argparse.REMAINDER, help="more Snakemake arguments, after --")
    p.set_defaults(func=cmd_cron)

    p = with_config(sub.add_parser("verify", help="find stages whose manifest or outputs can't be trusted"))
    p.add_argument("--repair", action="store_true", help="archive them so the next run redoes them")
    p.add_argument("--no-checksums", action="store_true", help="check output sizes only, not sha256")
    p.set_defaults(func=cmd_verify)

    profiles = sub.add_parser("profiles", help="Snakemake profiles").add_subparsers(dest="action", required=True)
    p = profiles.add_parser("install", help="make the repo's profiles usable by bare name (--profile local)")
    p.add_argument("--source", default="profiles", help="the repo's profiles dir (default: %(default)s)")
    p.add_argument("--target", default="~/.config/snakemake", help="where Snakemake looks (default: %(default)s)")
    p.set_defaults(func=cmd_profiles_install)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except wconfig.ConfigError as exc:
        print(f"waypost: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
