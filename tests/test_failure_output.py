"""A failing step reads as in plain Snakemake: the same failing rule run
with plain Snakemake and with waypost, side by side. waypost's output has
Snakemake's ``Error in rule`` block with the user's command as Snakemake
formats it, the runner's end state and decision, and no Python traceback,
no step spec, no runner line; it is about as long as plain Snakemake's."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import LOCAL_PROFILE, REPO, finish, one_rule_plain, one_rule_waypost

from waypost.model import spec as wspec

LABEL = "brine"
# As the user writes it; it fails with a status of its own (4).
COMMAND = "echo {params.label} > {output.jar}; grep -qx pickled {output.jar} || exit 4"


def _rule(output: str) -> str:
    return (f"rule ferment:\n    output: jar={output}\n    params: label={LABEL!r}\n"
            f"    shell: {json.dumps(COMMAND)}\n")


def _plain(workdir: Path) -> Path:
    return one_rule_plain(workdir, _rule('"crock/jar.txt"'), '"crock/jar.txt"')


def _waypost(workdir: Path, pools: dict | None = None) -> Path:
    return one_rule_waypost(workdir, _rule('wp.out("jar.txt")'), pools)


def _shell_line(workdir: Path) -> int:
    """The Snakefile's line of the rule's ``shell:``, where Snakemake says a
    failing shell command is."""
    lines = (workdir / "workflow" / "Snakefile").read_text().splitlines()
    return next(n for n, line in enumerate(lines, 1) if line.startswith("    shell:"))


def _snakemake(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "snakemake", "-s", "workflow/Snakefile", "--cores", "2", *args],
                          cwd=workdir, capture_output=True, text=True, timeout=300)


def _error_block(output: str) -> str:
    """The command in Snakemake's ``Error in rule`` block for the job."""
    return f"    shell:\n        {output_command(output)}\n        (command exited with non-zero exit code)"


def output_command(output: str) -> str:
    return COMMAND.format(params=type("P", (), {"label": LABEL}), output=type("O", (), {"jar": output}))


def _assert_reads_as_plain(out: str, jar: str) -> None:
    """No traceback, no step spec, no runner line; Snakemake's error block
    with the command as the user wrote it, formatted with the job's values."""
    for noise in ("Traceback", 'File "', "<waypost step of", '"waypost_step"', wspec.DELIMITER, "launch.py"):
        assert noise not in out, f"{noise!r} in waypost's output:\n{out}"
    assert "Error in rule ferment:" in out, out
    assert _error_block(jar) in out, out
    assert re.search(r"^waypost: e1/ferment attempt 1 .*ended FAILED", out, re.M), out
    assert re.search(r"^waypost: e1/ferment: next: fail \(", out, re.M), out


def _failed_manifest(workdir: Path) -> dict:
    data = json.loads((workdir / "results" / "_all" / "e1" / "ferment" / "_manifest.json").read_text())
    assert data["state"] == "FAILED" and data["outputs"] == []
    assert [a["exit_code"] for a in data["attempts"]] == [4]
    return data


@pytest.fixture(scope="module")
def side_by_side(tmp_path_factory):
    plain = _plain(tmp_path_factory.mktemp("plain"))
    wp = _waypost(tmp_path_factory.mktemp("waypost"))
    return (plain, _snakemake(plain)), (wp, _snakemake(wp, "--profile", str(LOCAL_PROFILE)))


def test_a_failing_step_reads_as_in_plain_snakemake(side_by_side):
    (plain, plain_run), (wp, wp_run) = side_by_side
    plain_out, out = plain_run.stdout + plain_run.stderr, wp_run.stdout + wp_run.stderr
    assert plain_run.returncode != 0 and wp_run.returncode != 0
    # What plain Snakemake shows, which the step's failure matches:
    assert _error_block("crock/jar.txt") in plain_out, plain_out
    assert "Traceback" not in plain_out
    _assert_reads_as_plain(out, "results/_all/e1/ferment/jar.txt")
    # Snakemake's own line for a failing command, as plain Snakemake words it:
    # where the rule's shell: is, and the command with Snakemake's prefix.
    for workdir, text, jar in ((plain, plain_out, "crock/jar.txt"), (wp, out, "results/_all/e1/ferment/jar.txt")):
        snakefile = workdir / "workflow" / "Snakefile"
        assert (f'RuleException:\nCalledProcessError in file "{snakefile}", line {_shell_line(workdir)}:\n'
                f"Command 'set -euo pipefail;  {output_command(jar)}' returned non-zero exit status 4.") in text, text
    _failed_manifest(wp)
    # waypost adds its profile's line and the runner's two; Snakemake's own
    # lines are plain Snakemake's (give or take its shutdown notice).
    assert len(out.splitlines()) <= len(plain_out.splitlines()) + 4, f"{out}\n---- plain:\n{plain_out}"


def test_printed_commands_are_the_users(tmp_path):
    """``--printshellcmds`` prints the rule's command, as in plain Snakemake."""
    wp = _waypost(tmp_path)
    run = _snakemake(wp, "--profile", str(LOCAL_PROFILE), "--printshellcmds")
    out = run.stdout + run.stderr
    assert run.returncode != 0
    assert f"\nShell command: {output_command('results/_all/e1/ferment/jar.txt')}\n" in out, out
    _assert_reads_as_plain(out, "results/_all/e1/ferment/jar.txt")
    _failed_manifest(wp)


def test_a_failing_slurm_step_reads_as_in_plain_snakemake(slurm_cluster, tmp_path):
    """On the onprem profile the job runs in Slurm: Snakemake's error block
    names the user's command, and the runner's end state and decision come
    back from the job."""
    pools = {"pools": {"onprem": {"executor": "slurm", "classes": {
        "cpu": {"partition": "cpu", "cpus": 1, "mem_mb": 200, "runtime": 10}}}}}
    wp = _waypost(tmp_path, pools)
    proc = subprocess.Popen(
        [sys.executable, "-m", "snakemake", "-s", "workflow/Snakefile", "--profile", str(REPO / "profiles" / "onprem"),
         "--waypost-init-seconds-before-status-checks", "1", "--latency-wait", "5", "--waypost-no-account"],
        cwd=wp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    code, out = finish(proc, timeout=300)
    assert code != 0
    _assert_reads_as_plain(out, "results/_all/e1/ferment/jar.txt")
    _failed_manifest(wp)
