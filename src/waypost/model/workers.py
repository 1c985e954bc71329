"""Worker pools and classes → Snakemake resources; GPUS and WORKSPACE
of the worker a job landed on.

``config/workers.yaml`` maps pool → class → resources; rules name a class,
the config's ``pool`` (set by a profile) picks the pool. Resources use
Snakemake's common names (``gpu``, ``gpu_model``, ``gres``,
``cpus_per_task``, ``mem_mb``, ``runtime``, ``constraint``, ``qos``), and a
scheduler's own for the keys that are its own (``names``: the pool's
scheduler's, ``waypost.scheduler.resource_names``: Slurm's
``slurm_partition``, ``slurm_account``, ``slurm_extra``).

Inside a job, ``GPUS`` (space-separated device indices) comes from, in order:
``CUDA_VISIBLE_DEVICES``, Slurm's ``SLURM_STEP_GPUS`` / ``SLURM_JOB_GPUS``,
``nvidia-smi`` (all devices it lists), and last the pool's declared value.
``WORKSPACE`` (MB) is 3/4 of the smallest allocated GPU's memory when
``nvidia-smi`` answers, else the declared value.
"""

from __future__ import annotations

import math
import os

# The format of workers.yaml is the engine's, so its schema ships with it.
SCHEMA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "schemas", "workers.schema.yaml")
# workers.yaml key → Snakemake resource name, where executors share one
# (a scheduler's own keys, such as partition, are named by its ``resource_names``)
RESOURCE_NAMES = {
    "gpus": "gpu",
    "gpu_model": "gpu_model",
    "gres": "gres",
    "cpus": "cpus_per_task",
    "mem_mb": "mem_mb",
    "runtime": "runtime",
    "constraint": "constraint",
    "qos": "qos",
    "pack": "waypost_pack",   # read by waypost's executor (job arrays), not by Slurm
    "bundle": "waypost_bundle",   # read by waypost's executor (stages in one job), not by Slurm
}
WORKSPACE_FRACTION = 0.75
#: Where a pipeline's pools are unless its config's ``workers`` names a file.
DEFAULT_FILE = os.path.join("config", "workers.yaml")
#: waypost's own pools (one ``local`` pool), for a pipeline without that file.
PACKAGE_FILE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "defaults", "workers.yaml")
#: The class of a stage whose rule names none (``resources: worker=...``)
#: and that workers.yaml's ``assign`` gives none.
DEFAULT_CLASS = "cpu"


def pools_file(named: str | None, pipeline_dir: str | None = None, config_dir: str | None = None) -> str:
    """The pools file of a config: the one its ``workers`` names, else
    ``config/workers.yaml`` where the pipeline has one, else waypost's own.
    A relative path the config names is looked for beside the config file
    (``config_dir``: as the config's other files are), then where Snakemake
    runs, then in the pipeline's directory (a run with ``-d`` elsewhere)."""
    candidates = [named or DEFAULT_FILE]
    if not os.path.isabs(candidates[0]):
        if named and config_dir:
            candidates.insert(0, os.path.join(config_dir, named))
        if pipeline_dir:
            candidates.append(os.path.join(pipeline_dir, candidates[-1]))
    found = next((path for path in candidates if os.path.exists(path)), None)
    if found or named:
        return found or named   # a named file that is missing: loading it says so
    return PACKAGE_FILE


def load(path: str, check: bool = True) -> dict:
    """The pools file, validated against its schema (unless ``check`` is off:
    see ``config.prepare``)."""
    from waypost.model import config as wconfig
    data = wconfig.load_yaml(path)
    if check:
        wconfig.validate(data, wconfig.load_yaml(SCHEMA), path)
    return data


def worker_class(workers: dict, pool: str, name: str, source: str = "config") -> dict:
    from waypost.model import config as wconfig
    pools = workers["pools"]
    if pool not in pools:
        raise wconfig.ConfigError(f"{source}: pool {pool!r} is not in the workers file "
                                  f"(expected one of: {', '.join(pools)})")
    classes = pools[pool]["classes"]
    if name not in classes:
        raise wconfig.ConfigError(f"{source}: worker class {name!r} is not in pool {pool!r} "
                                  f"(expected one of: {', '.join(classes)})")
    return classes[name]


def _listed(value) -> list:
    return value if isinstance(value, list) else [value]


def assigned_class(workers: dict, rule: str, constants: dict) -> str | None:
    """The class workers.yaml's ``assign`` gives a rule that names none
    itself: the first entry whose ``rules`` (names or glob patterns) match
    its name, else the first whose ``resources`` all equal the rule's own
    (``constants``: the values it wrote, not functions). None: no entry does."""
    import fnmatch  # here: the step runner imports this module at every step
    entries = workers.get("assign") or []
    for entry in entries:
        if any(fnmatch.fnmatchcase(rule, pattern) for pattern in _listed(entry.get("rules", []))):
            return entry["class"]
    for entry in entries:
        wanted = entry.get("resources")
        if wanted and all(name in constants and str(constants[name]) in map(str, _listed(value))
                          for name, value in wanted.items()):
            return entry["class"]
    return None


def check_assignments(workers: dict, pool: str, path: str) -> None:
    """Each class ``assign`` names is one of the pool's (said at load time)."""
    from waypost.model import config as wconfig
    classes = workers["pools"][pool]["classes"]
    for index, entry in enumerate(workers.get("assign") or []):
        if entry["class"] not in classes:
            raise wconfig.ConfigError(f"{path}: assign[{index}].class: worker class {entry['class']!r} is not "
                                      f"in pool {pool!r} (expected one of: {', '.join(classes)})")


def resources(spec: dict, overrides: dict | None = None, attempt: int = 1,
              runtime_growth: float = 1.0, memory_growth: float = 1.0, names: dict | None = None) -> dict:
    """Snakemake resources for one attempt of a job of this class; ``names``:
    the pool's scheduler's own names (``waypost.scheduler.resource_names``)."""
    merged = {**{k: v for k, v in spec.items() if k != "env"}, **(overrides or {})}
    table = {**RESOURCE_NAMES, **(names or {})}
    out = {table[k]: v for k, v in merged.items() if k in table and v is not None}
    if "runtime" in out:
        # a bundle's job runs up to `bundle` stages in turn: its limit is theirs together
        out["runtime"] = math.ceil(out["runtime"] * runtime_growth ** (attempt - 1) * out.get("waypost_bundle", 1))
    if "mem_mb" in out:
        out["mem_mb"] = math.ceil(out["mem_mb"] * memory_growth ** (attempt - 1))
    return out


# --- inside a job -----------------------------------------------------------
def _on_path(program: str) -> bool:
    # shutil.which, without importing shutil at every step
    return any(os.access(os.path.join(directory, program), os.X_OK)
               for directory in os.environ.get("PATH", os.defpath).split(os.pathsep) if directory)


def _nvidia_smi() -> list[list[str]] | None:
    """This machine's GPUs as nvidia-smi lists them, [index, uuid, total
    memory in MB] each; None without nvidia-smi (or when it fails)."""
    if not _on_path("nvidia-smi"):
        return None
    import subprocess  # here: the step runner imports this module at every step
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid,memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return [[field.strip() for field in line.split(",")] for line in out.stdout.splitlines() if line.strip()]


def _device_list(value: str) -> list[str]:
    return [d for d in value.replace(",", " ").split() if d]


def detect_gpus(env: dict, declared: str | None, listed: list | None) -> tuple[str, str]:
    """(GPUS, where it came from); ``listed``: what nvidia-smi says."""
    for var in ("CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
        if env.get(var, "").strip() and env[var].strip() != "NoDevFiles":
            return " ".join(_device_list(env[var])), var
    if listed:
        return " ".join(row[0] for row in listed), "nvidia-smi"
    return (declared or "").strip(), "pool"


def detect_workspace(gpus: str, declared: int | None, listed: list | None) -> tuple[int | None, str]:
    """(WORKSPACE in MB, where it came from): a share of the smallest
    memory among the GPUs given to the step."""
    if listed:
        wanted = set(_device_list(gpus))
        totals = [int(float(row[2])) for row in listed
                  if len(row) >= 3 and (not wanted or row[0] in wanted or row[1] in wanted)]
        if totals:
            return int(min(totals) * WORKSPACE_FRACTION), "nvidia-smi"
    return declared, "pool"


# PATH → what nvidia-smi listed there: the machine's GPUs don't change under
# a run, so a process that forks runners (the step server, a bundle) asks
# once (``gpus_listed`` before the forks) and each step's runner inherits it.
# A listing that failed is asked again by the next step.
_LISTED: dict[str, list[list[str]]] = {}


def gpus_listed() -> list[list[str]] | None:
    """What ``nvidia-smi`` lists on this machine (see ``_nvidia_smi``),
    asked once per process and PATH."""
    path = os.environ.get("PATH", os.defpath)
    if path not in _LISTED:
        listed = _nvidia_smi()
        if listed is None:
            return None
        _LISTED[path] = listed
    return _LISTED[path]


def worker_env(env: dict, declared: dict | None) -> dict:
    """GPUS and WORKSPACE for a step, with their sources (for the manifest)."""
    declared = declared or {}
    listed = gpus_listed()   # (it takes a while on a GPU node)
    gpus, gpus_from = detect_gpus(env, declared.get("GPUS"), listed)
    workspace, workspace_from = detect_workspace(gpus, declared.get("WORKSPACE"), listed)
    return {"GPUS": gpus, "GPUS_from": gpus_from, "WORKSPACE": workspace, "WORKSPACE_from": workspace_from}
