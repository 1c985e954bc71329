"""The small helper API the Snakefile and rules use.

Rules stay plain Snakemake; they ask this module for stage paths, for inputs
(wrapped in ``ancient()`` in presence mode, so an existing output is done
whatever its timestamps), for a stage's settings, and for the step-runner
prefix of their shell command.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

from . import config as wconfig
from . import layout

INSTANCE = "{instance}"


def code_version(directory: str) -> str:
    """The git commit of the workflow (``-dirty`` when it has local changes)."""
    try:
        out = subprocess.run(["git", "-C", directory, "describe", "--always", "--dirty", "--abbrev=12"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 else "unknown"


class Pipeline:
    """Loads and validates the config, then answers the rules' questions.

    The default config file is read here rather than by a ``configfile:``
    directive so that a YAML error names the file, line and column; config
    files given with ``--configfile`` are loaded by Snakemake as usual, and
    ``--config KEY=VALUE`` overrides apply on top of either.
    """

    def __init__(self, config: dict, workflow, default_configfile: str = "config/config.yaml"):
        self.workflow_dir = workflow.basedir
        self.repo_dir = os.path.dirname(os.path.abspath(self.workflow_dir))
        try:
            if workflow.configfiles:
                source = ", ".join(map(str, workflow.configfiles))
            else:
                source = default_configfile
                loaded = wconfig.load_yaml(default_configfile)
                overrides = workflow.config_settings.overwrite_config or {}
                config.update(wconfig.merge(loaded, dict(overrides)))
            prepared = wconfig.prepare(dict(config), self.workflow_dir, source)
        except wconfig.ConfigError as exc:
            # A clean one-paragraph error from Snakemake, before any job runs.
            from snakemake.exceptions import WorkflowError
            raise WorkflowError(str(exc)) from None
        config.clear()
        config.update(prepared)
        self.config = config
        self.root = config["root"]
        self.presence = config["rerun_policy"] == "presence"
        self.code_version = code_version(self.workflow_dir)
        self.python = sys.executable
        self.scripts = os.path.join(self.repo_dir, "scripts")

    # --- names -----------------------------------------------------------
    @property
    def experiments(self) -> list[str]:
        return list(self.config["experiments"])

    def pairs(self, experiment: str) -> list[str]:
        return list(self.config["experiments"][experiment]["pairs"])

    def teachers(self, experiment: str) -> int:
        return self.config["experiments"][experiment]["teachers"]

    wildcard_constraints = {
        "pair": layout.NAME_PATTERN,
        "experiment": layout.NAME_PATTERN,
        "instance": layout.NAME_PATTERN,
    }

    # --- paths -----------------------------------------------------------
    def path(self, stage: str, filename: str, instance: str | None = None, pair: str = "{pair}") -> str:
        """Pattern of a stage output; ``instance=INSTANCE`` for per-instance stages."""
        parts = [pair, "{experiment}", stage] + ([instance] if instance else []) + [filename]
        return layout.join(self.root, *parts)

    def input(self, stage: str, filename: str, instance: str | None = None):
        """An upstream output as an input: in presence mode a present file is
        done whatever its mtime, so inputs never trigger reruns."""
        return self.mark(self.path(stage, filename, instance))

    def mark(self, path: str):
        if self.presence:
            from snakemake.io import ancient
            return ancient(path)
        return path

    # --- settings --------------------------------------------------------
    def settings(self, experiment: str, pair: str, stage: str) -> dict:
        return wconfig.stage_settings(self.config, experiment, pair, stage)

    def setting(self, stage: str, key: str):
        """A params callable giving one setting of the stage for a job."""
        def value(wildcards):
            return self.settings(wildcards.experiment, wildcards.get("pair", layout.ALL_PAIRS), stage).get(key)
        return value

    # --- the step runner ------------------------------------------------
    def step(self, stage: str):
        """A params callable giving the step-runner prefix for a job's command."""
        def prefix(wildcards, input, output):
            pair = wildcards.get("pair", layout.ALL_PAIRS)
            instance = wildcards.get("instance")
            settings = self.settings(wildcards.experiment, pair, stage)
            stage_dir = layout.stage_dir(self.root, pair, wildcards.experiment, stage, instance)
            argv = [self.python, "-m", "waypost.runner", "--stage-dir", stage_dir,
                    "--experiment", wildcards.experiment, "--pair", pair, "--stage", stage,
                    "--settings", json.dumps(settings, sort_keys=True, separators=(",", ":")),
                    "--config-hash", wconfig.settings_hash(settings),
                    "--code-version", self.code_version]
            if instance:
                argv += ["--instance", instance]
            for path in input:
                argv += ["--input", path]
            for path in output:
                argv += ["--output", path]
            return shlex.join(argv + ["--"])
        return prefix

    def script(self, name: str) -> str:
        return shlex.join([self.python, os.path.join(self.scripts, name)])

    # --- targets ---------------------------------------------------------
    def targets(self) -> list[str]:
        targets = []
        for experiment in self.experiments:
            targets.append(self.report_path(experiment, "report.md"))
            for pair in self.pairs(experiment):
                targets.append(self.path("export", "package.tar.gz", pair=pair).replace("{experiment}", experiment))
        return targets

    def report_path(self, experiment: str, filename: str) -> str:
        return layout.join(self.root, layout.ALL_PAIRS, experiment, "report", filename)
