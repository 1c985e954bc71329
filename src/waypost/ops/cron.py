"""``waypost cron``: one locked, idempotent run of the workflow, for crontab.

Safe to start every few minutes, forever, whatever the last run left:

1. a non-blocking ``flock`` on ``.waypost/cron.lock`` (Snakemake's own lock is
   not enough: a run that ends removes every run's locks); a second
   invocation says so in one line and exits 0;
2. the step a killed runner left at work is ended (``waypost.state.leftovers``),
   the partial outputs of interrupted attempts and manifests that can't be
   trusted are set aside (``waypost.state.verify``);
3. a Snakemake lock left by a killed run is cleared, only when no Snakemake
   process still works in this directory;
4. the workflow runs (the profile keeps going past failed jobs and redoes
   jobs a kill left incomplete);
5. a run record — start, end, jobs by end state — is appended to
   ``.waypost/cron.log`` (JSON lines); Snakemake's output goes to
   ``.waypost/runs/<start>.log``, kept when the run did something.

It exits non-zero only when waypost itself could not run (a config error, no
Snakemake): failed jobs are the run record's business.
"""

from __future__ import annotations

import fcntl
import itertools
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime

from waypost import stores
from waypost.model import config as wconfig
from waypost.model import events, graph, layout, manifest
from waypost.model.layout import RUNNING
from waypost.state import leftovers, lifecycle, verify

STATE_DIR = ".waypost"
LOCK = os.path.join(STATE_DIR, "cron.lock")
RUN_LOG = os.path.join(STATE_DIR, "cron.log")
RUNS = os.path.join(STATE_DIR, "runs")


def _snapshot(root: str) -> dict[str, tuple]:
    """stage dir → (created, state, given up) of its manifest."""
    found = {}
    tree = stores.store_for(root)
    for stage_dir in tree.manifest_dirs():
        life = lifecycle.read(tree, stage_dir)
        if life.manifest:
            found[stage_dir] = (life.manifest.get("created"), life.manifest["state"], life.given_up)
    return found


def _set_aside_interrupted(root: str) -> list[str]:
    """Archive the partial outputs that attempts whose runner is gone left
    (the files its ``_running.json`` names), before Snakemake would delete
    them to redo the stage: the rest of the workspace (checkpoints) stays for
    the policy to resume from. A stage whose runner may still be at work is
    left alone, and said so; the step a gone runner left at work is ended
    first (``leftovers``), and said so."""
    tree = stores.store_for(root)
    dirs = tree.marker_dirs(RUNNING)
    notes = []
    for stage_dir in dirs:
        life = lifecycle.read(tree, stage_dir)
        if life.live and life.live.orphaned:
            ended = leftovers.end(life, None if stores.is_bucket_url(stage_dir) else stage_dir)
            notes.append(f"{stage_dir}: {ended}")
            life = lifecycle.read(tree, stage_dir)
        if life.live:
            notes.append(f"left {stage_dir} alone: an attempt may still be at work there ({life.live.where})")
            continue
        if not life.interrupted:   # a manifest written after the marker closed the attempt
            continue
        try:
            archived = tree.set_aside_outputs(stage_dir, life.marker)
        except manifest.ManifestError as exc:   # an .attempts that is a link out: never archived through it
            notes.append(f"left {stage_dir} alone: {exc}")
            continue
        if archived:
            notes.append(f"set aside the partial outputs of interrupted {stage_dir} in {archived}")
    return notes


def _name(root: str, stage_dir: str) -> str:
    """A stage dir as experiment/pair/stage[/instance] (the runner's words)."""
    prefix = root.rstrip("/") + "/"
    rel = stage_dir[len(prefix):] if stage_dir.startswith(prefix) else os.path.relpath(stage_dir, root)
    parts = rel.split("/")
    return layout.stage_name(*parts) if len(parts) >= 3 else stage_dir


def _snakemake_alive_here(workdir: str) -> list[int]:
    """Pids of Snakemake main processes working in ``workdir``."""
    mine = os.getpid()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == mine:
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            continue
        args = [a.decode(errors="replace") for a in argv if a]
        main = any(os.path.basename(a) == "snakemake" for a in args[:2]) or \
            any(a == "-m" and b == "snakemake" for a, b in itertools.pairwise(args))
        if main and "--mode" not in args and "--unlock" not in args \
                and os.path.realpath(cwd) == os.path.realpath(workdir):
            pids.append(int(entry))
    return pids


def _has_snakemake_lock(workdir: str) -> bool:
    locks = os.path.join(workdir, ".snakemake", "locks")
    return os.path.isdir(locks) and any(name.endswith(".lock") for name in os.listdir(locks))


def run(profile: str | None, snakemake_args: list[str], config_path: str | None, workflow_dir: str,
        checksums: bool = True, workflow_profile: str | None = None) -> int:
    """One cron tick: under the cron lock, tidy the root, run Snakemake,
    append the run's record to RUN_LOG and print its summary."""
    lock = _take_lock()   # (held while this runs: released as run returns and the file closes)
    if lock is None:
        return 0
    try:
        cfg = graph.load_config(workflow_dir, graph.facts(config_path, workflow_dir, profile, workflow_profile))
    except (wconfig.ConfigError, graph.GraphError) as exc:
        print(f"waypost cron: {exc}", file=sys.stderr)
        return 2
    root = cfg["root"]
    started_at = datetime.now(UTC)
    output = os.path.join(RUNS, f"{started_at.strftime('%Y%m%dT%H%M%SZ')}.log")
    command = [sys.executable, "-m", "snakemake", "-s", graph.snakefile_in(workflow_dir)] \
        + (["--profile", profile] if profile else []) + stores.snakemake_options(root) + snakemake_args
    if config_path:
        command += ["--configfile", config_path]
    if workflow_profile:
        command += ["--workflow-profile", workflow_profile]

    notes = _tidy(root, checksums, command)
    if notes is None:
        return 0
    for note in notes:
        print(f"waypost cron: {note}")

    before = _snapshot(root)
    start = time.monotonic()
    reported = output[:-len(".log")] + ".events.jsonl"   # what Snakemake reports of its jobs (events)
    with open(output, "w") as log:
        try:
            proc = subprocess.run(command + events.snakemake_args(reported), stdout=log, stderr=subprocess.STDOUT)
        except OSError as exc:
            print(f"waypost cron: cannot run Snakemake: {exc}", file=sys.stderr)
            return 2
    record = {
        "start": started_at.isoformat(timespec="seconds"),
        "end": datetime.now(UTC).isoformat(timespec="seconds"),
        "duration_s": round(time.monotonic() - start, 1),
        "command": command,
        "snakemake_exit": proc.returncode,
        **_outcome(root, before, _snapshot(root), events.errors(events.read(reported)), proc.returncode),
        "notes": notes,
        "log": output,
    }
    record["events"] = reported if os.path.exists(reported) else None
    if record["nothing_to_do"]:  # keep the run log of runs that did something, not of every idle tick
        os.unlink(output)
        record["log"] = None
        if record["events"]:
            os.unlink(reported)
            record["events"] = None
    with open(RUN_LOG, "a") as f:
        f.write(json.dumps(record) + "\n")
    return _report(record, output)


def _take_lock():
    """The cron lock file, held (our pid written in it), or None when another
    run holds it (said on stdout: a tick with nothing to do)."""
    os.makedirs(RUNS, exist_ok=True)
    lock = open(LOCK, "a+")  # noqa: SIM115 (held for the whole run)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        owner = lock.read().strip() or "?"
        print(f"waypost cron: another run (pid {owner}) holds {LOCK}; nothing to do")
        lock.close()
        return None
    lock.seek(0)
    lock.truncate()
    lock.write(str(os.getpid()))
    lock.flush()
    return lock


def _tidy(root: str, checksums: bool, command: list[str]) -> list[str] | None:
    """Before a run: interrupted attempts and outputs that fail verification
    set aside, a lock left by a gone Snakemake cleared; notes of each. None
    when a Snakemake is still running here (said on stdout: nothing to do)."""
    notes = _set_aside_interrupted(root)
    verified = verify.verify(root, checksums=checksums)
    for problem in verified:
        notes.append(f"set aside {problem.stage_dir} ({problem.what}; archived in {problem.archived})")
    if checksums and verified.sizes_only and verified.listed:
        notes.append(verify.SIZES_ONLY.format(n=verified.sizes_only))
    if _has_snakemake_lock(os.getcwd()):
        alive = _snakemake_alive_here(os.getcwd())
        if alive:
            print(f"waypost cron: Snakemake (pid {', '.join(map(str, alive))}) is running here; nothing to do")
            return None
        subprocess.run(command + ["--unlock"], capture_output=True, text=True)
        notes.append("cleared a Snakemake lock left by a run that is gone")
    return notes


def _outcome(root: str, before: dict, after: dict, job_errors: list, returncode: int) -> dict:
    """A run record's counts and names: the stage directories whose
    manifest it changed (``before``/``after``: _snapshot), by state."""
    changed = {d: state for d, (created, state, _) in after.items() if before.get(d, (None,))[0] != created}
    by_state: dict[str, int] = {}
    for state in changed.values():
        by_state[state] = by_state.get(state, 0) + 1
    return {
        "jobs": len(changed),
        "succeeded": by_state.get("SUCCESS", 0),
        "failed": len(changed) - by_state.get("SUCCESS", 0),
        "job_errors": len(job_errors),   # Snakemake's: jobs it saw fail (a stage's series may go on)
        "by_state": by_state,
        "failed_stages": sorted(_name(root, d) + f" {state}" for d, state in changed.items() if state != "SUCCESS"),
        "given_up": sorted(_name(root, d) for d, (_, _, gave_up) in after.items() if gave_up),
        "nothing_to_do": returncode == 0 and not changed,
    }


def _report(record: dict, output: str) -> int:
    """The run's summary lines; its exit code (Snakemake's, when it could not
    run at all: it failed with no stage changed and no job failed)."""
    summary = ", ".join(f"{n} {s}" for s, n in sorted(record["by_state"].items())) or "no stage changed"
    print(f"waypost cron: {record['jobs']} stage(s) ran ({summary}) in {record['duration_s']} s; "
          f"snakemake exited {record['snakemake_exit']}" + (f"; log {output}" if record["log"] else ""))
    if record["failed_stages"]:
        print("waypost cron: not successful this run: " + ", ".join(record["failed_stages"]))
    if record["given_up"]:
        print(f"waypost cron: given up ({len(record['given_up'])}; no run starts them again until "
              "`waypost retry` or `waypost rerun`): " + ", ".join(record["given_up"]))
    if record["snakemake_exit"] != 0 and not record["jobs"] and not record["job_errors"]:
        with open(output) as f:
            tail = f.read()[-2000:]
        print(f"waypost cron: Snakemake could not run; see {output}:\n" + tail, file=sys.stderr)
        return record["snakemake_exit"]
    return 0
