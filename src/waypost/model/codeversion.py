"""A stage's code version: the code its step runs, as a short hash.

It is the manifest's ``code_version``, which ``waypost plan`` compares
with the current one. It covers the rule's shell command as written
(before wildcards are filled: inputs, outputs and settings are
``{input…}``/``{params…}`` placeholders, so data and settings are not in
it), the contents of the files that command names (the scripts
``wp.script()`` inserts; not the Python interpreter), and waypost's
version; a ``script:`` rule's script, a ``run:`` rule's code. Paths are
taken relative to the repository, so a moved checkout or another venv is
the same code. Made once per stage and process (a cluster job's own
process makes its stage's: the code it is about to run).
"""

from __future__ import annotations

import hashlib
import os
import shlex
import sys

#: A stage's code version is this prefix and 12 hex digits; manifests of
#: waypost before it hold the repository's ``git describe`` (another
#: format: not comparable, see ``plan.drift``).
CODE_PREFIX = "sha256:"


def is_stage_code_version(value: str | None) -> bool:
    return bool(value) and value.startswith(CODE_PREFIX)


def code_digest(command: str, files: list[tuple[str, bytes]]) -> str:
    """A step's code version: its command as the rule writes it (paths of the
    files it runs made relative, the interpreter named ``python``), those
    files' contents ((name, sha256 digest) each) and waypost's version."""
    from waypost import __version__
    digest = hashlib.sha256(f"waypost {__version__}\0{command}\0".encode())
    for name, content in files:
        digest.update(name.encode() + b"\0" + content + b"\0")
    return CODE_PREFIX + digest.hexdigest()[:12]


class CodeVersions:
    """``rule_code(stage)``: ("shell", command as written), ("script",
    path, whether it is a file to read) or ("run", its source)."""

    def __init__(self, repo_dir: str, rule_code, python: str = sys.executable):
        self.repo_dir = repo_dir
        self._rule_code = rule_code
        self.python = python
        self._versions: dict[str, str] = {}
        self._digests: dict[str, bytes] = {}

    def of(self, stage: str) -> str:
        if stage not in self._versions:
            kind, text, *rest = self._rule_code(stage)
            if kind == "shell":
                command, paths = self._command_files(text)
            elif kind == "script":
                paths = [text] if rest[0] else []
                command = "script: " + (self._repo_relative(text) if rest[0] else text)
            else:
                command, paths = text, []
            self._versions[stage] = code_digest(
                command, [(self._repo_relative(p), self._digest(p)) for p in paths])
        return self._versions[stage]

    def _command_files(self, command: str) -> tuple[str, list[str]]:
        """A shell command template with its file paths made relative to the
        repository and the interpreter named ``python``, and the (absolute)
        paths of the files it names: its words that are existing files
        (placeholders and options are not)."""
        try:
            words = shlex.split(command)
        except ValueError:   # unbalanced quotes around a placeholder, say
            words = command.split()
        interpreters = {self.python, sys.executable, os.path.realpath(sys.executable)}
        normal, paths = [], []
        for word in words:
            if word in interpreters:
                word = "python"
            elif "{" not in word and not word.startswith("-") and ("/" in word or "." in word):
                path = os.path.abspath(word)
                if os.path.isfile(path) and os.path.realpath(path) not in interpreters:
                    paths.append(path)
                    word = self._repo_relative(path)
            normal.append(word)
        return " ".join(normal), paths

    def _repo_relative(self, path: str) -> str:
        return os.path.relpath(path, self.repo_dir) if path.startswith(self.repo_dir + os.sep) else path

    def _digest(self, path: str) -> bytes:
        if path not in self._digests:
            with open(path, "rb") as f:
                self._digests[path] = hashlib.sha256(f.read()).digest()
        return self._digests[path]
