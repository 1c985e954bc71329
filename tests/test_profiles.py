"""Profiles work by bare name after set-up (copies of the package's, the same
from any checkout), and by path; a user's own profile of the same name is
never overwritten."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import REPO, SMALL_CONFIG, write_config

from waypost.cli import setup as clisetup


def waypost_install(home: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "waypost.cli", "profiles", "install",
                           "--target", str(home / ".config/snakemake")],
                          capture_output=True, text=True, check=True)


def dry_run(workdir: Path, profile: str, home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HOME": str(home)}
    env.pop("XDG_CONFIG_HOME", None)
    env.pop("SNAKEMAKE_PROFILE", None)
    return subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "workflow/Snakefile"),
                           "--profile", profile, "--configfile", "config.yaml", "-n"],
                          cwd=workdir, capture_output=True, text=True, env=env)


def test_bare_name_after_install(tmp_path):
    home = tmp_path / "home"
    work = tmp_path / "work"
    work.mkdir()
    write_config(work, SMALL_CONFIG)
    assert dry_run(work, "local", home).returncode != 0  # not findable before set-up
    out = waypost_install(home)
    installed = home / ".config/snakemake/local"
    assert str(installed) in out.stdout
    assert not installed.is_symlink()   # a copy: it doesn't follow whichever checkout ran last
    assert (installed / "config.yaml").read_text() == Path(clisetup.PACKAGE_PROFILES, "local", "config.yaml").read_text()
    proc = dry_run(work, "local", home)
    assert proc.returncode == 0, proc.stderr
    assert "fetch_corpus" in proc.stdout
    # Installing again refreshes waypost's own copy.
    assert str(installed) in waypost_install(home).stdout


def test_users_own_profile_is_left_alone(tmp_path):
    home = tmp_path / "home"
    mine = home / ".config/snakemake/local"
    mine.mkdir(parents=True)
    (mine / "config.yaml").write_text("cores: 1\n")
    out = waypost_install(home)
    assert "left alone" in out.stderr
    assert not mine.is_symlink() and (mine / "config.yaml").read_text() == "cores: 1\n"


def test_profile_by_path(tmp_path):
    write_config(tmp_path, SMALL_CONFIG)
    (tmp_path / "profiles").symlink_to(REPO / "profiles")
    proc = dry_run(tmp_path, "profiles/local", tmp_path / "nohome")
    assert proc.returncode == 0, proc.stderr


def test_stale_link_from_another_checkout_is_replaced(tmp_path):
    home = tmp_path / "home"
    links = home / ".config/snakemake"
    links.mkdir(parents=True)
    (links / "local").symlink_to(tmp_path / "deleted-checkout/profiles/local")  # dangling
    out = waypost_install(home)
    assert str(links / "local") in out.stdout
    assert not (links / "local").is_symlink() and (links / "local" / "config.yaml").exists()


# Three stages of two instances each, written lowest priority first: one core
# runs one job at a time, so the order the jobs ran in is the order the
# profile's scheduler chose them in.
PRIORITIES = '''import os
from waypost.snakemake import Pipeline
wp = Pipeline(config, workflow)
ORDER = os.path.abspath("order.txt")

rule dusk:
    output: wp.out("out.txt", instances=["a", "b"])
    priority: 1
    shell: "echo {rule} >> {ORDER:q}; touch {output}"

rule noon:
    output: wp.out("out.txt", instances=["a", "b"])
    priority: 5
    shell: "echo {rule} >> {ORDER:q}; touch {output}"

rule dawn:
    output: wp.out("out.txt", instances=["a", "b"])
    priority: 9
    shell: "echo {rule} >> {ORDER:q}; touch {output}"

wp.finish()

rule all:
    default_target: True
    input: wp.targets
'''


def test_local_profile_runs_higher_priority_first(tmp_path):
    """The shipped local profile's scheduler picks ready jobs by `priority:`."""
    (tmp_path / "Snakefile").write_text(PRIORITIES)
    write_config(tmp_path, {"root": "results", "experiments": {"e1": {}}})
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-s", "Snakefile", "--profile", str(REPO / "profiles/local"),
                           "--configfile", "config.yaml", "--cores", "1"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "order.txt").read_text().split() == ["dawn"] * 2 + ["noon"] * 2 + ["dusk"] * 2
