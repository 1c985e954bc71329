"""A Merlin study spec (``merlin run spec.yaml``) read into a ``Study``:
Maestro's parts (``maestro.study_of``), its ``merlin.samples`` (a file,
``column_labels``, a ``generate`` command), and its exit-code protocol as
cues.

Merlin's protocol, as its ``merlin_step`` task keeps it: ``$(MERLIN_RESTART)``
runs the step's ``restart:`` (else its command) again in its workspace,
``$(MERLIN_RETRY)`` its command; both after ``retry_delay`` seconds, up to
``max_retries`` (30) times, then a soft failure. Any other non-zero status
is a soft failure: the step failed, and the steps after it run.
``$(MERLIN_HARD_FAIL)`` and ``$(MERLIN_STOP_WORKERS)`` stop the workers: no
new step starts.
"""

from __future__ import annotations

import csv
import os
import subprocess

from waypost.model import paramsets
from waypost.ops.imports import maestro
from waypost.ops.imports.study import TOKEN, SpecError, Study

#: Merlin's exit-code tokens (merlin.common.enums.ReturnCode).
CODES = {"MERLIN_SUCCESS": 0, "MERLIN_RESTART": 100, "MERLIN_SOFT_FAIL": 101, "MERLIN_HARD_FAIL": 102,
         "MERLIN_RETRY": 104, "MERLIN_STOP_WORKERS": 105, "MERLIN_RAISE_ERROR": 106}
#: The cue each code is, in the order tried.
CUES = [("MERLIN_RESTART", {"action": "restart"}),
        ("MERLIN_RETRY", {"action": "rerun", "rerun": "dirty"}),
        ("MERLIN_HARD_FAIL", {"action": "stop"}),
        ("MERLIN_STOP_WORKERS", {"action": "stop"})]
DEFAULT_RETRIES = 30
#: A step's ``run`` keys Merlin adds (its queue is Celery's: nothing to map).
RUN_KEYS = frozenset({"max_retries", "retry_delay", "task_queue"})
#: The parameter that numbers the samples ($(MERLIN_SAMPLE_ID)).
SAMPLE = "sample"


def read(path: str, target: str, samples_file: str | None = None) -> Study:
    """The study of a Merlin spec; ``target``: the directory the pipeline is
    written to (its ``config/`` is ``$(MERLIN_INFO)``: a ``generate``
    command writes the samples there)."""
    spec = maestro.read_yaml(path, "Merlin")
    study = maestro.study_of(spec, path, "Merlin", run_keys=RUN_KEYS)
    info = os.path.join(target, "config")
    study.fixed.update({name: str(code) for name, code in CODES.items()})
    study.fixed.update({"MERLIN_INFO": "{MERLIN_INFO}", "MERLIN_WORKSPACE": "{OUTPUT_PATH}",
                        "MERLIN_GLOB_PATH": "*", "MERLIN_SAMPLE_PATH": ""})
    merlin = spec.get("merlin") or {}
    _workers(study, merlin.get("resources") or {}, [raw["run"] for raw in spec["study"]])
    samples = merlin.get("samples")
    if samples or samples_file:
        _samples(study, samples or {}, info, samples_file)
    for i, raw in enumerate(spec["study"]):
        _protocol(study, study.steps[i], raw["run"])
        _sample_paths(study, study.steps[i])
    return study


def _sample_paths(study: Study, step) -> None:
    """Merlin puts a step's samples in a hierarchy below its parameters'
    labels; here each sample is an instance directory of the step."""
    used = {m.group(1) for text in (step.cmd, step.restart or "") for m in TOKEN.finditer(text)}
    if used & {"MERLIN_GLOB_PATH", "MERLIN_SAMPLE_PATH", "MERLIN_PATHS_ALL"}:
        step.notes.append(f"{study.spec}: {step.where}: $(MERLIN_GLOB_PATH) is * and $(MERLIN_SAMPLE_PATH) empty: "
                          "each sample's directory is an instance directory of its step ($(step.workspace)/*, "
                          "named by its values), not Merlin's hierarchy; check the paths its command builds")


def _protocol(study: Study, step, run: dict) -> None:
    """The step's exit codes as cues, ``max_retries`` and ``retry_delay``;
    a step after others runs whatever their end (a soft failure goes on)."""
    used = {m.group(1) for text in (step.cmd, step.restart or "") for m in TOKEN.finditer(text)}
    cues = [{**cue, "when": f"cmd.exit == {CODES[name]}"} for name, cue in CUES if name in used]
    policy = {}
    if cues:
        policy["cues"] = cues
        policy["restart"] = "same"
        retries = run.get("max_retries", DEFAULT_RETRIES)
        policy["max_attempts"] = int(retries) + 1
        policy["attempt_delay"] = float(run.get("retry_delay", 1))
    if step.depends:
        policy["depends"] = "all_done"
    if run.get("walltime"):
        policy["runtime"] = step.runtime
    step.policy = policy   # (Maestro's restart-on-timeout is not Merlin's: its restart is the exit code's)


def _workers(study: Study, resources: dict, runs: list[dict]) -> None:
    """Celery's workers and the steps' queues have nothing to map to: said
    once, naming what was read."""
    keys = ["merlin.resources.workers"] if resources.get("workers") else []
    keys += ["the steps' task_queue"] if any(run.get("task_queue") for run in runs) else []
    if keys:
        study.notes.append(f"{study.spec}: {' and '.join(keys)}: Celery's workers and queues are not needed: the run's "
                           "--jobs/--cores and the profile's pool (config/workers.yaml) decide what runs at once")


def _samples(study: Study, samples: dict, info: str, samples_file: str | None) -> None:
    """The samples as points: a row each, crossed with the study's
    parameters (Merlin's instances are combinations × samples)."""
    columns = [str(c) for c in samples.get("column_labels") or []]
    if not columns:
        raise SpecError(f"{study.spec}: merlin.samples.column_labels: required (a name per column of the samples)")
    clash = [c for c in columns if c in study.parameters]
    if clash:
        raise SpecError(f"{study.spec}: merlin.samples.column_labels: {clash[0]!r} is also in global.parameters "
                        "(Merlin refuses it too): rename one")
    path = samples_file or _spec_path(study, str(samples.get("file") or ""), info)
    if not path:
        raise SpecError(f"{study.spec}: merlin.samples.file: required (or give --samples FILE)")
    if not os.path.exists(path) and not samples_file and (samples.get("generate") or {}).get("cmd"):
        _generate(study, samples["generate"]["cmd"], info)
    rows = _rows(study, path, len(columns))
    name = SAMPLE if SAMPLE not in columns and SAMPLE not in study.parameters else "merlin_sample"
    combos = _combos(study)
    study.table = [{**combo, name: i, **dict(zip(columns, row))} for combo in combos for i, row in enumerate(rows)]
    study.parameters = {}
    study.group = [name, *columns]
    study.fixed["MERLIN_SAMPLE_ID"] = f"{{params.{name}}}"
    study.group_tokens = {"MERLIN_SAMPLE_ID", "MERLIN_SAMPLE_PATH", *columns}
    study.fixed["MERLIN_SAMPLE_NAMES"] = " ".join(columns)
    study.fixed["MERLIN_SAMPLE_VECTOR"] = " ".join(f"{{params.{c}}}" for c in columns)
    study.samples_from = path


def _combos(study: Study) -> list[dict]:
    if not study.parameters:
        return [{}]
    count = len(next(iter(study.parameters.values())))
    return [{k: v[i] for k, v in study.parameters.items()} for i in range(count)]


def _spec_path(study: Study, text: str, info: str) -> str:
    """A path of the spec (``$(MERLIN_INFO)/samples.npy``) as a path here."""
    spec_dir = os.path.dirname(os.path.abspath(study.spec))
    words = {"SPECROOT": spec_dir, "MERLIN_INFO": info, **{k: str(v) for k, v in study.variables.items()
                                                            if "$(" not in str(v)}}
    for _ in range(5):   # (variables may name each other)
        text = TOKEN.sub(lambda m: words.get(m.group(1), m.group(0)) if m.group(2) is None else m.group(0), text)
    return text


def _generate(study: Study, command: str, info: str) -> None:
    """Run the spec's ``generate`` command, as Merlin does when its samples
    file is not there (in the directory the pipeline is written to)."""
    made = not os.path.isdir(info)
    os.makedirs(info, exist_ok=True)
    line = _spec_path(study, command, info)
    print(f"waypost import: merlin.samples.generate.cmd: {line}", flush=True)
    done = subprocess.run(line, shell=True, cwd=os.path.dirname(info), capture_output=True, text=True)
    if done.returncode != 0:
        if made and not os.listdir(info):
            os.rmdir(info)
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or [""]
        raise SpecError(f"{study.spec}: merlin.samples.generate.cmd exited {done.returncode}: {last[0]} "
                        "(run it by hand, or give the samples with --samples FILE)")


def _rows(study: Study, path: str, width: int) -> list[list]:
    """A samples file's rows: ``.npy`` (NumPy), ``.csv``, or whitespace-separated."""
    if not os.path.exists(path):
        raise SpecError(f"{study.spec}: merlin.samples.file: {path}: not found (give the samples with --samples FILE)")
    if path.endswith(".npy"):
        try:
            import numpy
        except ImportError:
            raise SpecError(f"{path}: reading a .npy file needs NumPy (pip install numpy), or give the samples as "
                            "a CSV file with --samples FILE") from None
        rows = numpy.load(path, allow_pickle=False).tolist()
        rows = [r if isinstance(r, list) else [r] for r in rows]
    else:
        with open(path, encoding="utf-8", newline="") as f:
            if path.endswith(".csv"):
                rows = [r for r in csv.reader(f) if r]
            else:
                rows = [line.split() for line in f if line.strip()]
        rows = [[paramsets.cell_value(c) for c in r] for r in rows]
    for i, row in enumerate(rows):
        if len(row) != width:
            raise SpecError(f"{path}: sample {i + 1} has {len(row)} values, and merlin.samples.column_labels "
                            f"names {width}")
    return rows
