"""Slurm's own view of a job (``sacct``), mapped to waypost states."""

from __future__ import annotations

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
    """Raw job id → normalized sacct State of the whole job (no steps)."""
    import shutil  # not at the top: the step runner imports this module at every step
    import subprocess
    if not job_ids or not shutil.which("sacct"):
        return {}
    try:
        out = subprocess.run(["sacct", "-X", "-n", "-P", "-o", "JobIDRaw,State", "-j", ",".join(job_ids)],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    states = {}
    for line in out.stdout.splitlines():
        if "|" in line:
            job, state = line.split("|", 1)
            states[job.strip()] = normalize(state)
    return states


def final_state(job_id: str) -> tuple[str | None, str | None]:
    """(waypost state, sacct state) of a finished Slurm job; (None, None)
    when Slurm does not know it or it has not ended."""
    raw = sacct_states([str(job_id)]).get(str(job_id))
    if raw in TERMINAL:
        return STATES[raw], raw
    return None, raw
