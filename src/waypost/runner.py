"""The step runner: runs one attempt of a stage and records what happened.

Every rule's shell command goes through here::

    python -m waypost.runner --stage-dir DIR --experiment E --pair P --stage S \
        [--instance I] --settings JSON --config-hash H --code-version V \
        [--input F ...] [--output F ...] -- COMMAND ARGS...

What it does, in order: archive whatever an earlier attempt left in the stage
directory (under ``.attempts/<n>/``, never deleted); run the command in its own
process group with the stage's env, its output teed to ``_logs/attempt-<n>.log``;
classify how it ended; and write ``_manifest.json`` last and atomically. On
success the manifest lists every output with size and sha256; on failure it
records the failed attempt, and the runner exits non-zero so Snakemake sees it.
The command never runs through a shell here: names can't be interpreted.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from . import manifest
from .layout import LOGS, MANIFEST, RUNNING

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
KILL_GRACE_SECONDS = 10
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child: get SIGKILL if the runner dies (even by SIGKILL), so a
    step never outlives its runner and writes outputs nobody records."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def parse_args(argv: list[str]) -> argparse.Namespace:
    if "--" not in argv:
        raise SystemExit("waypost.runner: expected '-- COMMAND ...' after the options")
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="python -m waypost.runner")
    parser.add_argument("--stage-dir", required=True)
    parser.add_argument("--experiment", required=True)
    parser.add_argument("--pair", required=True)
    parser.add_argument("--stage", required=True)
    parser.add_argument("--instance")
    parser.add_argument("--settings", default="{}", help="the stage's settings as JSON")
    parser.add_argument("--config-hash", default="")
    parser.add_argument("--code-version", default="")
    parser.add_argument("--input", action="append", default=[])
    parser.add_argument("--output", action="append", default=[])
    args = parser.parse_args(argv[:split])
    args.command = argv[split + 1:]
    if not args.command:
        raise SystemExit("waypost.runner: no command given after '--'")
    return args


def describe_inputs(paths: list[str]) -> list[dict]:
    """Each input with the manifest of the stage that produced it.

    The checksum comes from that manifest (no re-hashing); an input without a
    manifest was placed by hand (adopted).
    """
    described = []
    for path in paths:
        stage_dir = os.path.dirname(path)
        entry = {"path": path, "manifest": None, "state": None, "sha256": None}
        try:
            data = manifest.read(stage_dir)
        except manifest.ManifestError:
            data = None
        if data is not None:
            entry["manifest"] = os.path.join(stage_dir, MANIFEST)
            entry["state"] = data["state"]
            name = os.path.relpath(path, stage_dir)
            entry["sha256"] = next((o["sha256"] for o in data.get("outputs", []) if o["path"] == name), None)
        else:
            entry["state"] = "ADOPTED" if os.path.exists(path) else "MISSING"
        described.append(entry)
    return described


class Attempt:
    """One run of the command, with signal forwarding and a teed log."""

    def __init__(self, command: list[str], env: dict, log_path: str):
        self.command = command
        self.env = env
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self.received_signal: int | None = None

    def _forward(self, signum, _frame):
        self.received_signal = signum
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            threading.Timer(KILL_GRACE_SECONDS, self._kill).start()

    def _kill(self):
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)

    def run(self) -> int:
        previous = {s: signal.signal(s, self._forward) for s in FORWARDED_SIGNALS}
        try:
            with open(self.log_path, "ab") as log:
                try:
                    self.proc = subprocess.Popen(self.command, env=self.env, stdout=subprocess.PIPE,
                                                 stderr=subprocess.STDOUT, start_new_session=True,
                                                 preexec_fn=_die_with_parent)
                except OSError as exc:
                    message = f"waypost: cannot start {self.command[0]!r}: {exc}\n".encode()
                    log.write(message)
                    sys.stderr.buffer.write(message)
                    return 127
                for line in iter(self.proc.stdout.readline, b""):
                    log.write(line)
                    log.flush()
                    sys.stderr.buffer.write(line)
                    sys.stderr.buffer.flush()
                return self.proc.wait()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)


def classify(returncode: int, received_signal: int | None, missing_outputs: list[str]) -> str:
    if received_signal is not None:
        return "CANCELLED"
    if returncode != 0:
        return "FAILED"
    if missing_outputs:
        return "FAILED"
    return "SUCCESS"


def run(args: argparse.Namespace) -> int:
    stage_dir = args.stage_dir
    os.makedirs(stage_dir, exist_ok=True)
    try:
        previous = manifest.read(stage_dir)
    except manifest.ManifestError as exc:
        print(f"waypost: {exc}; archiving it with the old workspace", file=sys.stderr)
        previous = None
    history = list(previous["attempts"]) if previous else []
    archived = manifest.archive_workspace(stage_dir)
    if archived:
        for old in history:
            if old.get("workspace") == ".":
                old["workspace"] = archived
                if old.get("log"):
                    old["log"] = os.path.join(archived, old["log"])
        print(f"waypost: earlier workspace of {stage_dir} archived in {archived}", file=sys.stderr)

    number = len(history) + 1
    os.makedirs(os.path.join(stage_dir, LOGS), exist_ok=True)
    log_rel = os.path.join(LOGS, f"attempt-{number}.log")
    attempt = {
        "number": number,
        "action": "cmd",
        "state": None,
        "exit_code": None,
        "signal": None,
        "start": manifest.now_iso(),
        "end": None,
        "duration_s": None,
        "host": socket.gethostname(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "command": args.command,
        "workspace": ".",
        "log": log_rel,
    }
    manifest.write_json_atomic(os.path.join(stage_dir, RUNNING),
                               {"pid": os.getpid(), "host": attempt["host"], "attempt": number,
                                "start": attempt["start"]})

    env = dict(os.environ)
    env.update({
        "WAYPOST_STAGE_DIR": stage_dir,
        "WAYPOST_EXPERIMENT": args.experiment,
        "WAYPOST_PAIR": args.pair,
        "WAYPOST_STAGE": args.stage,
        "WAYPOST_INSTANCE": args.instance or "",
        "WAYPOST_ATTEMPT": str(number),
    })
    started = time.monotonic()
    runner = Attempt(args.command, env, os.path.join(stage_dir, log_rel))
    returncode = runner.run()

    missing = [p for p in args.output if not os.path.exists(p)] if returncode == 0 else []
    state = classify(returncode, runner.received_signal, missing)
    attempt.update({
        "state": state,
        "exit_code": returncode if returncode >= 0 else None,
        "signal": -returncode if returncode < 0 else None,
        "end": manifest.now_iso(),
        "duration_s": round(time.monotonic() - started, 3),
    })
    if missing:
        attempt["error"] = "command exited 0 but did not write: " + ", ".join(missing)
        print(f"waypost: {attempt['error']}", file=sys.stderr)

    outputs = manifest.describe_outputs(stage_dir, args.output) if state == "SUCCESS" else []
    record = manifest.build(
        experiment=args.experiment, pair=args.pair, stage=args.stage, instance=args.instance,
        state=state, attempts=history + [attempt], outputs=outputs,
        inputs=describe_inputs(args.input), settings=json.loads(args.settings),
        config_hash=args.config_hash, code_version=args.code_version,
    )
    manifest.write_json_atomic(manifest.manifest_path(stage_dir), record)
    os.unlink(os.path.join(stage_dir, RUNNING))

    if state == "SUCCESS":
        return 0
    if returncode > 0:
        return returncode
    return 128 + (attempt["signal"] or runner.received_signal or 1)


def main(argv: list[str] | None = None) -> int:
    return run(parse_args(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
