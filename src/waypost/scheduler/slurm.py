"""waypost's one Slurm adapter: one ``sacct``/``squeue`` reader, one map from
Slurm's job states to waypost's, and what the cluster offers (``waypost
workers --check``). Every other module asks here: the executor (its status
rounds, asynchronously: it runs the commands these build and reads their
output with these parsers), the step runner and the lifecycle reader (how
did this attempt's job end; is it still alive).
"""

from __future__ import annotations

import re
from typing import ClassVar

from waypost.scheduler.base import JobState, Scheduler

# Slurm 22.05's job states (sacct ``State``, squeue ``%T``). A job in one of
# these has not ended; UNKNOWN (slurmctld lost track for a moment) is not an
# end either, and never a success: ask again.
ACTIVE = {"PENDING", "RUNNING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESIZING", "SUSPENDED", "STOPPED",
          "COMPLETING", "CONFIGURING", "SIGNALING", "STAGE_OUT", "RESV_DEL_HOLD", "UNKNOWN"}
# …and how each end is a waypost state. A node that failed under the job, or
# one that never booted for it, is a hardware failure; a deadline a time out.
STATES = {
    "COMPLETED": "SUCCESS",
    "FAILED": "FAILED",
    "TIMEOUT": "TIMEOUT",
    "DEADLINE": "TIMEOUT",
    "PREEMPTED": "PREEMPTED",
    "NODE_FAIL": "HWFAILURE",
    "BOOT_FAIL": "HWFAILURE",
    "OUT_OF_MEMORY": "OOM",
    "CANCELLED": "CANCELLED",
    "REVOKED": "CANCELLED",       # a federated sibling started elsewhere
    "SPECIAL_EXIT": "FAILED",
}
TERMINAL = set(STATES)
SACCT_FIELDS = ("JobID", "JobIDRaw", "State", "Reason")
# Pending reasons (squeue/sacct ``Reason``, Slurm 22.05) that no waiting clears.
NEVER_STARTS = {
    "PartitionTimeLimit": "its time limit is over the partition's MaxTime",
    "PartitionNodeLimit": "it asks for more nodes than the partition has",
    "PartitionConfig": "it asks for more than the partition's nodes offer (CPUs, memory or GRES)",
    "BadConstraints": "no node has the features or GRES it asks for",
    "InvalidAccount": "its account is not valid",
    "InvalidQOS": "its QOS is not valid",
    "QOSMaxWallDurationPerJobLimit": "its time limit is over its QOS's",
    "ReqNodeNotAvail, UnavailableNodes": "no node it may use is available",
}


def normalize(raw: str) -> str:
    """``CANCELLED by 0`` → ``CANCELLED``; ``OUT_OF_ME+`` stays as is."""
    return raw.strip().split(" ")[0].rstrip("+")


def waypost_state(slurm_state: str) -> str | None:
    """The waypost state of a job that ended so (None: it has not ended).
    A state this map does not know is a failure, never a success."""
    state = normalize(slurm_state)
    if state in ACTIVE or not state:
        return None
    return STATES.get(state, "FAILED")


class Row(JobState):
    """One job (or array task) as sacct says: its normalized ``state``,
    Slurm's ``reason`` ('' for none) and ``raw`` id (JobIDRaw: what its
    runner saw as ``SLURM_JOB_ID``; None for array tasks still pending,
    which share one row)."""

    __slots__ = ()

    def __init__(self, state: str, reason: str = "", raw: str | None = None):
        super().__init__(state, "" if reason in ("None", None) else reason, raw, waypost_state(state))


def sacct_command(job_ids: list[str]) -> list[str]:
    return ["sacct", "-X", "-n", "-P", "-o", ",".join(SACCT_FIELDS), "-j", ",".join(job_ids)]


def parse_sacct(text: str) -> dict[str, Row]:
    """sacct's rows (``sacct_command``) by job id: each job under its JobID
    and its JobIDRaw; an array task as ``<array>_<task>`` (and its raw id),
    pending tasks of one row (``123_[2-4]``) each by name."""
    rows: dict[str, Row] = {}
    for line in text.splitlines():
        parts = [part.strip() for part in line.split("|")]
        if len(parts) != len(SACCT_FIELDS):
            continue
        job_id, raw, state, reason = parts
        tasks = array_tasks(job_id)
        for one in tasks or [job_id, raw]:
            rows[one] = Row(normalize(state), reason, None if tasks else raw)
    return rows


def array_tasks(job_id: str) -> list[str]:
    """``123_[2-4,7%2]`` (array tasks still pending, in one sacct row) →
    ``123_2 123_3 123_4 123_7``; [] for any other id."""
    found = re.fullmatch(r"(\d+)_\[([0-9,-]+)(?:%\d+)?\]", job_id)
    if not found:
        return []
    tasks = []
    for part in found.group(2).split(","):
        first, _, last = part.partition("-")
        tasks += [f"{found.group(1)}_{i}" for i in range(int(first), int(last or first) + 1)]
    return tasks


def squeue_pending_command(job_ids: list[str]) -> list[str]:
    """Why jobs pend, as slurmctld says (slurmdbd hears it late or never)."""
    return ["squeue", "-h", "-t", "PENDING", "-r", "-o", "%i|%r", "-j",
            ",".join(sorted({i.split("_")[0] for i in job_ids}))]


def parse_squeue_pending(text: str, wanted: set[str]) -> dict[str, str]:
    reasons = {}
    for line in text.splitlines():
        job_id, _, reason = line.strip().partition("|")
        if job_id in wanted:
            reasons[job_id] = reason
    return reasons


def _run(argv: list[str], timeout: float = 60) -> str | None:
    """A Slurm command's output; None when it did not answer (not
    installed, its daemon down, a time out, a failure)."""
    import shutil  # not at the top: the step runner imports this module at every step
    import subprocess
    if not shutil.which(argv[0]):
        return None
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def sacct(job_ids: list[str]) -> dict[str, Row] | None:
    """``parse_sacct`` of one sacct call; None when sacct did not answer
    (not installed, slurmdbd down, a time out): unknown, never gone."""
    if not job_ids:
        return {}
    out = _run(sacct_command(job_ids))
    return None if out is None else parse_sacct(out)


def check(job_ids: list[str]) -> dict[str, Row] | None:
    """sacct's rows of the jobs, with the reason slurmctld gives for each
    pending one (slurmdbd hears it late or never: ``squeue``); None when
    sacct did not answer."""
    rows = sacct(sorted({i.split("_")[0] for i in job_ids}))   # (an array's id: every task's row)
    if rows is None:
        return None
    pending = [i for i in job_ids if rows.get(i, Row("PENDING")).state == "PENDING"]
    if pending:
        out = _run(squeue_pending_command(pending))
        for job_id, reason in (parse_squeue_pending(out, set(pending)) if out else {}).items():
            rows[job_id] = Row("PENDING", reason, rows[job_id].raw if job_id in rows else None)
    return rows


def final_state(job_id: str) -> tuple[str | None, str | None]:
    """(waypost state, sacct state) of a Slurm job that ended; (None, its
    state) while it has not, (None, None) when Slurm does not know it or
    sacct did not answer."""
    rows = sacct([str(job_id)])
    row = (rows or {}).get(str(job_id))
    if row is None:
        return None, None
    return row.ended, row.state


class Slurm(Scheduler):
    """Slurm as ``base.Scheduler``: its jobs' ends from sacct."""

    name, label, accounting, job_env = "slurm", "Slurm", "sacct", "SLURM_JOB_ID"
    array_index_env = "SLURM_ARRAY_TASK_ID"
    arrays = True
    # (the Slurm executor plugin's names; the rest are Snakemake's common ones)
    resource_names: ClassVar[dict[str, str]] = {"partition": "slurm_partition", "account": "slurm_account", "extra": "slurm_extra"}

    def final_state(self, job: str) -> tuple[str | None, str | None]:
        return final_state(job)

    def check(self, jobs: list[str]) -> dict[str, JobState] | None:
        rows = check(jobs)
        return None if rows is None else dict(rows)

    def never_starts(self, job: JobState) -> str | None:
        return NEVER_STARTS.get(job.reason) if job.state == "PENDING" else None

    def cancel(self, job: str) -> None:
        _run(["scancel", str(job)])

    def cluster_facts(self) -> dict | None:
        return cluster_facts()

    def class_mismatches(self, spec: dict, facts: dict) -> list[str]:
        return class_mismatches(spec, facts)


SLURM = Slurm()


# --- what the cluster offers (``waypost workers --check``) ----------------------

def _records(text: str) -> list[dict]:
    """``scontrol show ... -o`` lines → one dict of Key=Value each."""
    return [dict(re.findall(r"(\w+)=(\S*)", line)) for line in text.splitlines() if "=" in line]


def cluster_facts() -> dict | None:
    """Partitions and nodes as ``scontrol`` shows them, and the accounts and
    QOS sacctmgr knows (None each where it does not answer); None without
    scontrol."""
    def run(*argv: str) -> str | None:
        return _run(list(argv), timeout=30)

    partitions, nodes = run("scontrol", "show", "partition", "-o"), run("scontrol", "show", "node", "-o")
    if partitions is None or nodes is None:
        return None
    accounts = run("sacctmgr", "-n", "-P", "show", "account", "format=account")
    qos = run("sacctmgr", "-n", "-P", "show", "qos", "format=name")
    return {"partitions": {p["PartitionName"]: p for p in _records(partitions) if "PartitionName" in p},
            "nodes": _records(nodes),
            "accounts": None if accounts is None else set(accounts.split()),
            "qos": None if qos is None else set(qos.split())}


def minutes(value: str) -> float | None:
    """A Slurm time (``UNLIMITED``, ``D-HH:MM:SS``, ``HH:MM:SS``, ``MM:SS``,
    ``MM``) in minutes; None for no limit."""
    if value in ("UNLIMITED", "INFINITE", "NONE", ""):
        return None
    days, _, rest = value.rpartition("-")
    parts = [float(p) for p in rest.split(":")]
    hours, mins, secs = ([0.0] * (3 - len(parts)) + parts) if len(parts) > 1 else (0.0, parts[0], 0.0)
    return (float(days or 0) * 24 + hours) * 60 + mins + secs / 60


def _gres(value: str) -> dict[str, int]:
    """``gpu:v100:4(S:0),gpu:a100:4`` → {"gpu": 8, "gpu:v100": 4, "gpu:a100": 4}."""
    counts: dict[str, int] = {}
    for item in value.split(","):
        fields = item.split("(")[0].split(":")
        if len(fields) < 2 or not fields[-1].isdigit():
            continue
        number = int(fields[-1])
        counts[fields[0]] = counts.get(fields[0], 0) + number
        if len(fields) == 3:
            counts[f"{fields[0]}:{fields[1]}"] = counts.get(f"{fields[0]}:{fields[1]}", 0) + number
    return counts


def class_mismatches(spec: dict, facts: dict) -> list[str]:
    """What in a worker class (workers.yaml keys) the cluster can never give:
    one line each, naming the key, the value and the cluster's limit."""
    partitions = facts["partitions"]
    name = spec.get("partition") or next((p for p, v in partitions.items() if v.get("Default") == "YES"), None)
    if name not in partitions:
        return [f"partition {spec.get('partition')!r}: no such partition (the cluster has: "
                f"{', '.join(partitions)})" if spec.get("partition") else "no partition given and none is the default"]
    nodes = [n for n in facts["nodes"] if name in n.get("Partitions", "").split(",")]
    return [*_runtime_mismatch(spec, name, partitions[name]), *_node_size_mismatches(spec, name, nodes),
            *_gpu_mismatch(spec, name, nodes), *_constraint_mismatch(spec, name, nodes),
            *_unknown_names(spec, facts)]


def _runtime_mismatch(spec: dict, name: str, partition: dict) -> list[str]:
    limit = minutes(partition.get("MaxTime", "UNLIMITED"))
    if spec.get("runtime") and limit is not None and spec["runtime"] > limit:
        return [f"runtime {spec['runtime']:g} min: over partition {name}'s MaxTime ({limit:g} min): "
                "Slurm would never start it (PartitionTimeLimit)"]
    return []


def _node_size_mismatches(spec: dict, name: str, nodes: list[dict]) -> list[str]:
    """cpus and mem_mb more than any node of the partition has."""
    problems = []
    most_cpus = max((int(n.get("CPUTot", 0) or 0) for n in nodes), default=0)
    if spec.get("cpus") and spec["cpus"] > most_cpus:
        problems.append(f"cpus {spec['cpus']}: no node of partition {name} has that many (at most {most_cpus})")
    most_memory = max((int(n.get("RealMemory", 0) or 0) for n in nodes), default=0)
    if spec.get("mem_mb") and spec["mem_mb"] > most_memory:
        problems.append(f"mem_mb {spec['mem_mb']}: no node of partition {name} has that much "
                        f"(at most {most_memory} MB)")
    return problems


def _gpu_mismatch(spec: dict, name: str, nodes: list[dict]) -> list[str]:
    if not spec.get("gpus"):
        return []
    kind = "gpu" + (f":{spec['gpu_model']}" if spec.get("gpu_model") else "")
    most = max((_gres(n.get("Gres", "")).get(kind, 0) for n in nodes), default=0)
    if spec["gpus"] > most:
        return [f"gpus {spec['gpus']}" + (f" × {spec['gpu_model']}" if spec.get("gpu_model") else "")
                + f": no node of partition {name} has them (at most {most} {kind})"]
    return []


def _constraint_mismatch(spec: dict, name: str, nodes: list[dict]) -> list[str]:
    if not spec.get("constraint"):
        return []
    features = set()
    for n in nodes:
        features |= set(n.get("AvailableFeatures", "").split(",")) - {"(null)", ""}
    # ``a&b``, ``a|b``, ``[a*2&b*4]``: features joined, some with a node count
    wanted = [f.split("*")[0] for f in re.split(r"[&|,\[\]()\s]+", spec["constraint"])]
    missing = [f for f in wanted if f and f not in features]
    if missing:
        return [f"constraint {spec['constraint']!r}: no node of partition {name} has "
                f"{', '.join(missing)} (they have: {', '.join(sorted(features)) or 'no features'})"]
    return []


def _unknown_names(spec: dict, facts: dict) -> list[str]:
    """An account or QOS Slurm does not know (when the facts list them)."""
    return [f"{key} {spec[key]!r}: Slurm does not know it (it has: {', '.join(sorted(known))})"
            for key, known in (("account", facts.get("accounts")), ("qos", facts.get("qos")))
            if spec.get(key) and known is not None and spec[key] not in known]
