"""Drift from inputs outside the results root, for ``waypost plan``: the
done stages that read a file since edited (its fingerprint in their
manifest, ``fingerprints``), the stages made from those downstream, and
the ``waypost rerun`` that redoes them. Presence mode keeps them: this is
said, never acted on."""

from __future__ import annotations

import os
import shlex

from waypost.model import layout
from waypost.model.fingerprints import Comparer

EDITED = "input edited since: {path} ({change})"
MADE_FROM = "made from an edited input: {path} (through {through})"


def dir_key(path: str) -> str:
    """One spelling of a stage directory (a relative path is the workflow
    directory's, as Snakemake names it)."""
    return path.rstrip("/") if "://" in path else os.path.abspath(path)


class InputEdits:
    """Fed each done stage of a drift walk (``saw``); says which read an
    edited outside input (``edited``) and which were made from those
    (``downstream``)."""

    def __init__(self):
        self.comparer = Comparer()
        self.rows: dict[str, dict] = {}          # stage dir → its drift row (what may be empty)
        self.parents: dict[str, set[str]] = {}   # stage dir → the stage dirs its inputs came from
        self.edits: dict[str, list[dict]] = {}   # stage dir → the outside inputs edited since
        self.done: dict[tuple, int] = {}         # (experiment, pair, stage) → done stage dirs seen

    def edited(self, data: dict) -> list[dict]:
        """The outside inputs of a manifest edited since: path and change."""
        found = []
        for item in data.get("inputs") or []:
            recorded = item.get("fingerprint") if isinstance(item, dict) else None
            if isinstance(recorded, dict) and isinstance(item.get("path"), str) \
                    and all(type(recorded.get(k)) is int for k in ("size", "mtime_ns")):
                change = self.comparer.change(item["path"], recorded)
                if change:
                    found.append({"path": item["path"], "change": change})
        return found

    def saw(self, directory: str, data: dict, row: dict, edits: list[dict]) -> None:
        """A done stage, its drift row (kept, to add to) and its edited inputs."""
        key = dir_key(directory)
        self.rows[key] = row
        self.parents[key] = {dir_key(os.path.dirname(i["manifest"])) for i in data.get("inputs") or []
                             if isinstance(i, dict) and isinstance(i.get("manifest"), str)}
        if isinstance(data.get("reused_from"), str):   # a reused copy was made from its source
            self.parents[key].add(dir_key(data["reused_from"]))
        if edits:
            self.edits[key] = edits
            row["edited_inputs"] = edits
        cell = (row["experiment"], row["pair"], row["stage"])
        self.done[cell] = self.done.get(cell, 0) + 1

    def finish(self, config: dict) -> list[dict]:
        """Once every done stage was seen: adds to the rows of the stages
        made from one that read an edited input (directly or further down)
        what they were made from, gives each row of a stage that read one
        the ``waypost rerun`` that redoes it and what was made from it, and
        returns the rows that had no drift before."""
        new, below = self._downstream()
        readers: dict[str, list[dict]] = {}
        for key in self.edits:
            if key not in below:   # (one made from another that read it: that one's rerun redoes it)
                readers.setdefault(self.rows[key]["stage"], []).append(self.rows[key])
        for stage, cells in readers.items():
            command = self._rerun_command(stage, cells, config)
            for row in cells:
                row["rerun"] = command
        return new

    def _downstream(self) -> tuple[list[dict], set[str]]:
        """The rows made new by what they were made from, and every stage
        dir downstream of one that read an edited input."""
        children: dict[str, list[str]] = {}
        for child, parents in self.parents.items():
            for parent in parents:
                children.setdefault(parent, []).append(child)
        made_from: dict[str, dict[str, set]] = {}   # stage dir → path → the stages that read it
        for source, edits in self.edits.items():
            todo, seen = list(children.get(source, [])), set()
            while todo:
                child = todo.pop()
                if child in seen or child == source:
                    continue
                seen.add(child)
                todo += children.get(child, [])
                for edit in edits:
                    made_from.setdefault(child, {}).setdefault(edit["path"], set()).add(self.rows[source]["stage"])
        new = []
        for child, paths in made_from.items():
            row = self.rows[child]
            if not row["what"]:
                new.append(row)
            notes = [{"path": path, "through": sorted(through)} for path, through in sorted(paths.items())]
            row["made_from_edited"] = notes
            row["what"] += [MADE_FROM.format(path=n["path"], through=", ".join(n["through"])) for n in notes]
        return new, set(made_from)

    def _rerun_command(self, stage: str, cells: list[dict], config: dict) -> str:
        """``waypost rerun STAGE --downstream``, narrowed to ``cells`` (drift
        rows of that stage) where they are not all of its done ones."""
        words = ["waypost", "rerun", stage, "--downstream"]
        experiments = sorted({c["experiment"] for c in cells})
        if len(config["experiments"]) > 1:
            words += _repeated("--experiment", experiments)
        pairs = sorted({c["pair"] for c in cells} - {layout.ALL_PAIRS})
        if pairs and set(pairs) != {p for e in experiments for p in config["experiments"][e]["pairs"]}:
            words += _repeated("--pair", pairs)
        return shlex.join(words + self._instance_words(stage, cells, experiments))

    def _instance_words(self, stage: str, cells: list[dict], experiments: list[str]) -> list[str]:
        """``--instance`` for each of the cells' instances, where they are
        not all of the stage's done ones."""
        instances = sorted({c["instance"] for c in cells if c.get("instance") is not None})
        every = sum(self.done.get((e, p, stage), 0) for e in experiments for p in {c["pair"] for c in cells})
        return _repeated("--instance", instances) if instances and len(cells) < every else []


def _repeated(option: str, values: list[str]) -> list[str]:
    """``option`` before each value: ``--pair a --pair b``."""
    return [word for value in values for word in (option, value)]


def advice(rows: list[dict], config: dict) -> list[str]:
    """One line per edited outside input of ``plan``'s drift rows: what
    changed, the stages made from its old version, and the ``waypost
    rerun`` that redoes them (presence mode keeps them until then)."""
    return [_advice_line(path, entry, config) for path, entry in _edited_inputs(rows).items()]


def _edited_inputs(rows: list[dict]) -> dict[str, dict]:
    """Each edited input of the drift rows: its changes, the rows that read
    it, their reruns and how many stages downstream were made from it."""
    edited: dict[str, dict] = {}
    for row in rows:
        for edit in row.get("edited_inputs") or []:
            entry = edited.setdefault(edit["path"], {"changes": [], "cells": [], "commands": [], "downstream": 0})
            if edit["change"] not in entry["changes"]:
                entry["changes"].append(edit["change"])
            entry["cells"].append(row)
            if row.get("rerun") and row["rerun"] not in entry["commands"]:
                entry["commands"].append(row["rerun"])
    for row in rows:
        for note in row.get("made_from_edited") or []:
            if note["path"] in edited:
                edited[note["path"]]["downstream"] += 1
    return edited


def _advice_line(path: str, entry: dict, config: dict) -> str:
    """``advice``'s line for one edited input (``_edited_inputs``' entry)."""
    cells = entry["cells"]
    names = [layout.stage_name(r["pair"], r["experiment"], r["stage"], r["instance"]) for r in cells]
    shown = ", ".join(names[:3]) + (f", … +{len(names) - 3}" if len(names) > 3 else "")
    who = f"{shown} was" if len(cells) == 1 else f"{len(cells)} stages were ({shown})"
    later = f", and {entry['downstream']} stage(s) downstream of {'it' if len(cells) == 1 else 'them'}" \
        if entry["downstream"] else ""
    them = "them" if len(cells) > 1 or later else "it"
    keeps = (f"presence mode keeps {them} until then" if config.get("rerun_policy", "presence") == "presence"
             else "mtime mode: the next run does when it is newer than their outputs")
    return (f"{path}: {'; '.join(entry['changes'])}; {who} made from it{later}: "
            + " and ".join(f"`{c}`" for c in entry["commands"])
            + f" {'redo' if len(entry['commands']) > 1 else 'redoes'} {them} ({keeps})")
