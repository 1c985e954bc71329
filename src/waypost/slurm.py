"""Slurm's own view of a job (``sacct``), mapped to waypost states."""

from __future__ import annotations

import re

# sacct State → waypost state
STATES = {
    "COMPLETED": "SUCCESS",
    "FAILED": "FAILED",
    "TIMEOUT": "TIMEOUT",
    "PREEMPTED": "PREEMPTED",
    "NODE_FAIL": "HWFAILURE",
    "BOOT_FAIL": "HWFAILURE",
    "OUT_OF_MEMORY": "OOM",
    "CANCELLED": "CANCELLED",
    "DEADLINE": "TIMEOUT",
}
TERMINAL = set(STATES)


def normalize(raw: str) -> str:
    """``CANCELLED by 0`` → ``CANCELLED``; ``OUT_OF_ME+`` stays as is."""
    return raw.strip().split(" ")[0].rstrip("+")


def sacct_states(job_ids: list[str]) -> dict[str, str]:
    """Job id → normalized sacct State of the whole job (no steps), under
    its raw id and, for an array task, its ``<array>_<task>`` id too."""
    import shutil  # not at the top: the step runner imports this module at every step
    import subprocess
    if not job_ids or not shutil.which("sacct"):
        return {}
    try:
        out = subprocess.run(["sacct", "-X", "-n", "-P", "-o", "JobID,JobIDRaw,State", "-j", ",".join(job_ids)],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    states = {}
    for line in out.stdout.splitlines():
        if line.count("|") == 2:
            job, raw, state = line.split("|")
            states[raw.strip()] = states[job.strip()] = normalize(state)
    return states


def final_state(job_id: str) -> tuple[str | None, str | None]:
    """(waypost state, sacct state) of a finished Slurm job; (None, None)
    when Slurm does not know it or it has not ended."""
    raw = sacct_states([str(job_id)]).get(str(job_id))
    if raw in TERMINAL:
        return STATES[raw], raw
    return None, raw


# --- what the cluster offers (``waypost workers --check``) ----------------------

def _records(text: str) -> list[dict]:
    """``scontrol show ... -o`` lines → one dict of Key=Value each."""
    return [dict(re.findall(r"(\w+)=(\S*)", line)) for line in text.splitlines() if "=" in line]


def cluster_facts() -> dict | None:
    """Partitions and nodes as ``scontrol`` shows them, and the accounts and
    QOS sacctmgr knows (None each where it does not answer); None without
    scontrol."""
    import shutil
    import subprocess

    def run(*argv: str) -> str | None:
        if not shutil.which(argv[0]):
            return None
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout if out.returncode == 0 else None

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
    partition, problems = partitions[name], []
    nodes = [n for n in facts["nodes"] if name in n.get("Partitions", "").split(",")]
    limit = minutes(partition.get("MaxTime", "UNLIMITED"))
    if spec.get("runtime") and limit is not None and spec["runtime"] > limit:
        problems.append(f"runtime {spec['runtime']:g} min: over partition {name}'s MaxTime ({limit:g} min): "
                        "Slurm would never start it (PartitionTimeLimit)")
    most_cpus = max((int(n.get("CPUTot", 0) or 0) for n in nodes), default=0)
    if spec.get("cpus") and spec["cpus"] > most_cpus:
        problems.append(f"cpus {spec['cpus']}: no node of partition {name} has that many (at most {most_cpus})")
    most_memory = max((int(n.get("RealMemory", 0) or 0) for n in nodes), default=0)
    if spec.get("mem_mb") and spec["mem_mb"] > most_memory:
        problems.append(f"mem_mb {spec['mem_mb']}: no node of partition {name} has that much "
                        f"(at most {most_memory} MB)")
    if spec.get("gpus"):
        kind = "gpu" + (f":{spec['gpu_model']}" if spec.get("gpu_model") else "")
        most = max((_gres(n.get("Gres", "")).get(kind, 0) for n in nodes), default=0)
        if spec["gpus"] > most:
            problems.append(f"gpus {spec['gpus']}" + (f" × {spec['gpu_model']}" if spec.get("gpu_model") else "")
                            + f": no node of partition {name} has them (at most {most} {kind})")
    if spec.get("constraint"):
        features = set()
        for n in nodes:
            features |= set(n.get("AvailableFeatures", "").split(",")) - {"(null)", ""}
        # ``a&b``, ``a|b``, ``[a*2&b*4]``: features joined, some with a node count
        wanted = [f.split("*")[0] for f in re.split(r"[&|,\[\]()\s]+", spec["constraint"])]
        missing = [f for f in wanted if f and f not in features]
        if missing:
            problems.append(f"constraint {spec['constraint']!r}: no node of partition {name} has "
                            f"{', '.join(missing)} (they have: {', '.join(sorted(features)) or 'no features'})")
    for key, known in (("account", facts.get("accounts")), ("qos", facts.get("qos"))):
        if spec.get(key) and known is not None and spec[key] not in known:
            problems.append(f"{key} {spec[key]!r}: Slurm does not know it (it has: {', '.join(sorted(known))})")
    return problems
