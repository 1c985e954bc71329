"""A step runs exactly the user's command, with Snakemake's shell semantics:
each snippet ends the same way under waypost as under plain Snakemake
(success or failure), side by side, and the step's own exit status is what
waypost records. Also: the workflow's own shell.prefix(), and a command of
any length (nothing carries it as one argument)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

# (name, shell snippet, succeeds under plain Snakemake?). Each writes its
# rule's {output} (or should); Snakemake runs it as `set -euo pipefail; ...`.
SNIPPETS = [
    ("list_failure", "false; echo made > {output}", False),
    ("list_failure_last_word_ok", "ls /nonexistent-waypost-dir; echo made > {output}", False),
    ("pipeline_failure", "grep -q needle /dev/null | sort > {output}", False),
    ("pipeline_failure_in_middle", "printf 'b\\na\\n' | (exit 2) | sort > {output}", False),
    ("unset_variable", "echo ${{WAYPOST_TEST_NEVER_SET_VARIABLE}} > {output}", False),
    ("subshell_failure", "(cd /nonexistent-waypost-dir && echo x); echo made > {output}", False),
    ("substitution_failure", "v=$(false); echo $v > {output}", False),
    ("exit_code", "echo made > {output}; exit 3", False),
    ("exit_zero_no_output", "echo nothing written", False),
    ("failure_tolerated_by_or", "false || true; echo made > {output}", True),
    ("failure_in_condition", "if grep -q needle /dev/null; then :; fi; echo made > {output}", True),
    ("set_plus_e", "set +e; false; echo made > {output}", True),
    ("here_document", "cat > {output} <<'EOF'\nline one\n$NOT_EXPANDED\nEOF", True),
    ("here_document_failing_reader", "(exit 5) <<EOF > {output}\nx\nEOF", False),
    ("trap_on_exit", "trap 'echo trapped > {output}' EXIT; true", True),
    ("trap_then_failure", "trap 'echo trapped > {output}' EXIT; false", False),
    ("background_job_waited", "(sleep 0.1; echo later > {output}) & wait", True),
    ("background_failure_waited", "(sleep 0.1; exit 4) & wait $!; echo made > {output}", False),
    ("background_failure_not_waited", "(exit 4) & echo made > {output}", True),
    ("braces_and_quotes", "{{ echo 'a \"b\" c'; echo \"$(echo nested)\"; }} > {output}", True),
    ("redirection_next_to_output", "(echo a;echo b)>{output};n=$(wc -l<{output});test $n -eq 2", True),
]


def _rule(name: str, snippet: str, waypost: bool) -> str:
    output = 'wp.out("out.txt")' if waypost else f'"plain/{name}/out.txt"'
    return f"rule {name}:\n    output: {output}\n    shell: {json.dumps(snippet)}\n"


def _write(workdir: Path, waypost: bool, preamble: str = "", snippets=SNIPPETS) -> None:
    rules = "\n".join(_rule(name, snippet, waypost) for name, snippet, _ in snippets)
    if waypost:
        text = (f"from waypost.snakemake import Pipeline\nwp = Pipeline(config, workflow)\n{preamble}\n{rules}\n"
                "wp.finish()\n\nrule all:\n    default_target: True\n    input: wp.targets\n")
        (workdir / "config").mkdir(parents=True)
        (workdir / "config" / "config.yaml").write_text(yaml.safe_dump({"root": "results",
                                                                        "experiments": {"e1": {}}}))
    else:
        targets = ", ".join(f'"plain/{name}/out.txt"' for name, _, _ in snippets)
        text = f"{preamble}\nrule all:\n    input: [{targets}]\n\n{rules}"
    (workdir / "workflow").mkdir(parents=True, exist_ok=True)
    (workdir / "workflow" / "Snakefile").write_text(text)


def _snakemake(workdir: Path, waypost: bool) -> subprocess.CompletedProcess:
    from conftest import LOCAL_PROFILE
    args = [sys.executable, "-m", "snakemake", "-s", "workflow/Snakefile", "--keep-going", "--cores", "2"]
    if waypost:
        args += ["--profile", str(LOCAL_PROFILE)]
    env = {k: v for k, v in os.environ.items() if k != "WAYPOST_TEST_NEVER_SET_VARIABLE"}
    return subprocess.run(args, cwd=workdir, capture_output=True, text=True, timeout=300, env=env)


def _outcomes(workdir: Path, waypost: bool, snippets=SNIPPETS) -> dict[str, bool]:
    """Each rule's end: a success, or not. Plain Snakemake removes a failed
    job's outputs; waypost's manifest says what happened."""
    if not waypost:
        return {name: (workdir / "plain" / name / "out.txt").exists() for name, _, _ in snippets}
    found = {}
    for name, _, _ in snippets:
        manifest = workdir / "results" / "_all" / "e1" / name / "_manifest.json"
        found[name] = json.loads(manifest.read_text())["state"] == "SUCCESS"
    return found


@pytest.fixture(scope="module")
def side_by_side(tmp_path_factory):
    plain, wp = tmp_path_factory.mktemp("plain"), tmp_path_factory.mktemp("waypost")
    _write(plain, waypost=False)
    _write(wp, waypost=True)
    ran = {"plain": _snakemake(plain, False), "waypost": _snakemake(wp, True)}
    return plain, wp, ran


@pytest.mark.parametrize(("name", "snippet", "succeeds"), SNIPPETS, ids=[s[0] for s in SNIPPETS])
def test_a_snippet_ends_as_it_does_in_plain_snakemake(side_by_side, name, snippet, succeeds):
    plain, wp, ran = side_by_side
    plain_end = _outcomes(plain, False)[name]
    waypost_end = _outcomes(wp, True)[name]
    assert plain_end == succeeds, f"plain Snakemake: {name} {'failed' if succeeds else 'succeeded'}\n" \
                                  + ran["plain"].stderr[-3000:]
    assert waypost_end == plain_end, f"waypost: {name} ended {waypost_end}, plain Snakemake {plain_end}\n" \
                                     + ran["waypost"].stderr[-3000:]
    if not succeeds:   # nothing of a failed step looks done
        stage = wp / "results" / "_all" / "e1" / name
        data = json.loads((stage / "_manifest.json").read_text())
        assert data["outputs"] == []


def test_the_steps_own_exit_status_is_what_waypost_records(side_by_side):
    _, wp, ran = side_by_side
    stage = wp / "results" / "_all" / "e1"
    (attempt,) = json.loads((stage / "exit_code" / "_manifest.json").read_text())["attempts"]
    assert attempt["state"] == "FAILED" and attempt["exit_code"] == 3
    (attempt,) = json.loads((stage / "pipeline_failure_in_middle" / "_manifest.json").read_text())["attempts"]
    assert attempt["exit_code"] == 2   # pipefail: the failing stage's status, as bash reports it
    # What ran is kept beside the log: the command, with Snakemake's prefix.
    script = (stage / "unset_variable" / attempt["script"]).read_text()
    assert script.startswith("set -euo pipefail; ") and "WAYPOST_TEST_NEVER_SET_VARIABLE" in script
    assert ran["waypost"].returncode != 0 and ran["plain"].returncode != 0


# What the command sees of its shell, compared whole with plain Snakemake's:
# its $0, no script file (BASH_SOURCE), the flags ($-: `c`, as a -c string),
# and the last command exec'd by the shell rather than forked from it (so its
# parent is not that shell: the two pids differ).
SHELL_VIEW = [
    ("shell_view", 'echo "$0|${{BASH_SOURCE[0]-none}}|$-" > {output}', True),
    ("last_command_execd", "echo $$ > {output}; sh -c 'echo $PPID >> {output}'", True),
]


def test_the_command_sees_its_shell_as_in_plain_snakemake(tmp_path):
    plain, wp = tmp_path / "plain", tmp_path / "waypost"
    _write(plain, waypost=False, snippets=SHELL_VIEW)
    _write(wp, waypost=True, snippets=SHELL_VIEW)
    for workdir, waypost in ((plain, False), (wp, True)):
        proc = _snakemake(workdir, waypost)
        assert proc.returncode == 0, proc.stderr[-3000:]
    seen = {}
    for workdir, where in ((plain, "plain/{}/out.txt"), (wp, "results/_all/e1/{}/out.txt")):
        view = (workdir / where.format("shell_view")).read_text().strip()
        shell_pid, parent_of_last = (workdir / where.format("last_command_execd")).read_text().split()
        seen[workdir.name] = (view, shell_pid == parent_of_last)
    assert seen["waypost"] == seen["plain"]
    _, source, flags = seen["plain"][0].split("|")
    assert source == "none" and "c" in flags and seen["plain"][1] is False


PREFIXED = [
    ("prefix_sets_a_variable", "echo $FROM_PREFIX > {output}; echo ${{UNSET_BUT_NOT_STRICT}} >> {output}", True),
    ("prefix_keeps_errexit", "false; echo made > {output}", False),
]


def test_the_workflows_own_shell_prefix_is_the_steps(tmp_path):
    """A workflow's shell.prefix() replaces Snakemake's strict default, in
    waypost's steps as in plain Snakemake."""
    preamble = 'shell.prefix("set -e; export FROM_PREFIX=prefixed; ")\n'
    plain, wp = tmp_path / "plain", tmp_path / "waypost"
    _write(plain, False, preamble, PREFIXED)
    _write(wp, True, preamble, PREFIXED)
    _snakemake(plain, False)
    ran = _snakemake(wp, True)
    assert _outcomes(wp, True, PREFIXED) == _outcomes(plain, False, PREFIXED) == \
        {name: ok for name, _, ok in PREFIXED}, ran.stderr[-3000:]
    made = wp / "results" / "_all" / "e1" / "prefix_sets_a_variable" / "out.txt"
    assert made.read_text() == (plain / "plain" / "prefix_sets_a_variable" / "out.txt").read_text() == "prefixed\n\n"


LONG_FUNNEL = '''
from waypost.snakemake import Pipeline
wp = Pipeline(config, workflow)

rule gather:
    input: parts=expand("parts/p{i:05d}.txt", i=range(N))
    output: all=wp.out("all.txt")
    shell: "cat {input.parts} > {output.all}; test $(wc -l < {output.all}) -eq N"

wp.finish()

rule all:
    default_target: True
    input: wp.targets
'''


def long_funnel(workdir: Path, count: int) -> list[str]:
    """A stage over ``count`` inputs: its command (every path) is far longer
    than one argument of a command line may be (128 KiB)."""
    (workdir / "workflow").mkdir(parents=True)
    (workdir / "workflow" / "Snakefile").write_text(LONG_FUNNEL.replace("N", str(count)))
    (workdir / "config").mkdir()
    (workdir / "config" / "config.yaml").write_text(yaml.safe_dump({"root": "results", "experiments": {"e1": {}}}))
    (workdir / "parts").mkdir()
    names = [f"parts/p{i:05d}.txt" for i in range(count)]
    for name in names:
        (workdir / name).write_text(name + "\n")
    return names


def check_long_funnel(workdir: Path, names: list[str]) -> dict:
    stage = workdir / "results" / "_all" / "e1" / "gather"
    data = json.loads((stage / "_manifest.json").read_text())
    assert data["state"] == "SUCCESS"
    assert [i["path"] for i in data["inputs"]] == names      # every input, in order
    assert (stage / "all.txt").read_text() == "".join(n + "\n" for n in names)
    script = (stage / data["attempts"][0]["script"]).read_text()
    assert len(script) > 128 * 1024 and names[-1] in script
    return data


def test_a_funnel_over_ten_thousand_inputs_runs_and_its_manifest_lists_every_one(tmp_path):
    # No argument of any command line carries the command: one that did
    # would fail with "Argument list too long" (E2BIG) at its exec.
    names = long_funnel(tmp_path, 10_000)
    from conftest import LOCAL_PROFILE
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-s", "workflow/Snakefile", "--profile",
                           str(LOCAL_PROFILE)], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Argument list too long" not in proc.stderr
    check_long_funnel(tmp_path, names)
