"""Setting a pipeline up: ``waypost init`` (a new one from the template),
``waypost profiles install`` (waypost's Snakemake profiles by bare name) and
``waypost workers`` (the worker pool it runs on, checked against Slurm)."""

from __future__ import annotations

import json
import os
import sys

from waypost import __version__
from waypost import scheduler as wscheduler
from waypost.cli import termwidth
from waypost.cli.args import load_config, profile_config
from waypost.model import config as wconfig
from waypost.model import layout

PROFILE_MARK = ".waypost-profile"


#: waypost's Snakemake profiles (local, onprem, cloud), shipped in the package.
PACKAGE_PROFILES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "profiles")


def _is_waypost_profile(path: str) -> bool:
    """One this command installed: a copy holding the mark file, or a link
    (how earlier versions installed them) dangling or into a waypost profile."""
    if os.path.islink(path):
        return not os.path.exists(path) or os.path.exists(os.path.join(path, PROFILE_MARK))
    return os.path.isdir(path) and os.path.exists(os.path.join(path, PROFILE_MARK))


def install_profiles(target_dir: str) -> list[str]:
    """Copy waypost's profiles where Snakemake looks for bare names
    (``--profile local``), replacing earlier waypost copies or links (of any
    checkout), never a profile of the user's; the lines to print."""
    import shutil
    lines = []
    target_dir = os.path.expanduser(target_dir)
    os.makedirs(target_dir, exist_ok=True)
    for name in sorted(os.listdir(PACKAGE_PROFILES)):
        source = os.path.join(PACKAGE_PROFILES, name)
        if not os.path.isdir(source):
            continue
        target = os.path.join(target_dir, name)
        if os.path.lexists(target) and not _is_waypost_profile(target):
            lines.append(f"profile {name}: {target} exists and is not waypost's; left alone "
                         f"(use --profile {source} instead)")
            continue
        fresh = target + ".waypost-new"
        shutil.rmtree(fresh, ignore_errors=True)
        shutil.copytree(source, fresh)
        if os.path.islink(target) or os.path.isfile(target):
            os.unlink(target)
        elif os.path.isdir(target):
            shutil.rmtree(target)
        os.rename(fresh, target)
        lines.append(f"profile {name}: {target} (waypost {__version__}'s)")
    return lines


def cmd_profiles_install(args) -> int:
    """waypost's profiles, usable by bare name."""
    for line in install_profiles(args.target):
        print(line, file=sys.stderr if "left alone" in line else sys.stdout)
    return 0


TEMPLATE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "template")


def cmd_init(args) -> int:
    """Write a runnable pipeline into a new directory (or an empty one)."""
    import shutil
    target = os.path.abspath(args.directory)
    if os.path.exists(target) and (not os.path.isdir(target) or os.listdir(target)):
        raise wconfig.ConfigError(f"{args.directory}: exists and is not an empty directory (nothing was written)")
    name = os.path.basename(target.rstrip(os.sep))
    if not layout.is_valid_name(name):
        raise wconfig.ConfigError(f"{args.directory}: {name!r} is not a valid pipeline name "
                                  f"(expected {layout.NAME_RULE})")
    shutil.copytree(TEMPLATE, target, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for folder, _, files in os.walk(target):
        for file in files:
            path = os.path.join(folder, file)
            with open(path, encoding="utf-8") as f:
                text = f.read()
            if "__NAME__" in text:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(text.replace("__NAME__", name))
    print(f"wrote a waypost pipeline in {args.directory}: workflow/Snakefile (generate → fit per dataset, "
          "a summarize funnel), config/, scripts/, tests/")
    if not args.no_profiles:
        for line in install_profiles(args.profiles_target):
            print(line, file=sys.stderr if "left alone" in line else sys.stdout)
    print(f"next: cd {args.directory} && snakemake --profile local && waypost status")
    return 0


def _profile_pool(profile: str) -> str | None:
    """The pool a Snakemake profile selects (its ``config: [pool=...]``);
    None when its ``config:`` list has no ``pool=``, which then is the
    config file's (a profile's ``config: ["root=..."]`` alone replaces the
    cloud profile's ``["pool=cloud"]``: said on stderr)."""
    path, entries = profile_config(profile)
    if "pool" in entries:
        return entries["pool"]
    if entries:
        print(f"waypost: {path} sets config: {sorted(entries)} but no pool=, so its runs use the config's pool "
              f"(a profile's config: list replaces another's whole; list pool= in it too)", file=sys.stderr)
    return None


def cmd_workers(args) -> int:
    """The resolved pool table: class → partition, GPUs, CPUs, memory, runtime, env."""
    from waypost.model import workers

    cfg = load_config(args)
    pool = args.pool or (args.profile and _profile_pool(args.profile)) or cfg["pool"]
    path = workers.pools_file(cfg.get("workers"), wconfig.pipeline_dir(args.workflow),
                              wconfig.config_dir(wconfig.derived(cfg).source))
    data = workers.load(path)
    if pool not in data["pools"]:
        raise wconfig.ConfigError(f"{path}: no pool {pool!r} (expected one of: {', '.join(data['pools'])})")
    spec = data["pools"][pool]
    if args.check:
        return check_pool(pool, spec, path)
    names = wscheduler.resource_names(spec["executor"])
    rows = {name: {**workers.resources(cls, names=names), "env": cls.get("env", {})}
            for name, cls in spec["classes"].items()}
    if args.json:
        json.dump({"pool": pool, "executor": spec["executor"], "classes": rows}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    termwidth.console().print(_pool_table(pool, spec, path, rows))
    return 0


def _pool_table(pool: str, spec: dict, path: str, rows: dict[str, dict]):
    """``waypost workers``' table: a row per class of the pool, with its
    resources (``rows``: class → its executor's resources and env)."""
    from rich.table import Table

    table = Table(title=f"pool [bold]{pool}[/] ({spec['executor']}, from {path})", title_justify="left")
    # (the table names the class's keys as workers.yaml does; --json, as its executor reads them)
    classes = spec["classes"]
    extras = {name: " ".join(f"{k}={cls[k]}" for k in ("constraint", "account", "qos", "extra") if cls.get(k))
              for name, cls in classes.items()}
    columns = ["class", "partition", "GPUs", "CPUs", "memory", "runtime"] + (["other"] if any(extras.values()) else [])
    for column in columns + ["env"]:
        table.add_column(column)
    for name, r in rows.items():
        cells = _class_cells(name, classes[name], r)
        if "other" in columns:
            cells.append(extras[name])
        table.add_row(*cells, " ".join(f"{k}={v}" for k, v in r["env"].items()))
    return table


def _class_cells(name: str, cls: dict, r: dict) -> list[str]:
    """A class's name, partition, GPUs, CPUs, memory and runtime, as the table shows them."""
    gpus = r.get("gres") or (f"{r.get('gpu', 0)}" + (f" × {r['gpu_model']}" if r.get("gpu_model") else "")
                             if r.get("gpu") else "–")
    return [name, cls.get("partition", "–"), gpus, str(r.get("cpus_per_task", "–")),
            f"{r['mem_mb']} MB" if r.get("mem_mb") else "–", f"{r['runtime']} min" if r.get("runtime") else "–"]


def check_pool(pool: str, spec: dict, path: str) -> int:
    """Each class of a scheduler's pool against what its cluster has (Slurm:
    scontrol, sacctmgr): 1 when one of them could never start."""
    scheduler = wscheduler.of_pool(spec["executor"])
    if scheduler is None:
        print(f"pool {pool} ({path}) runs on this machine: nothing to check against a scheduler")
        return 0
    facts = scheduler.cluster_facts()
    if facts is None:
        print(f"waypost workers --check: {scheduler.label} did not answer; can't check pool {pool} against "
              "the cluster", file=sys.stderr)
        return 1
    bad = 0
    for name, cls in spec["classes"].items():
        problems = scheduler.class_mismatches(cls, facts)
        bad += bool(problems)
        print(f"{pool}/{name}: " + ("ok" if not problems else "; ".join(problems)))
    if bad:
        print(f"{bad} class(es) of pool {pool} ({path}) ask for what this cluster can't give: "
              "their jobs would never start")
    return 1 if bad else 0
