"""MkDocs hooks: the reference pages' tables, generated from the code, so
they can't drift from it, and committed, so they read on disk as on the site.

A page holds a generated block between two marker lines; the text between
them is the generator's, rewritten by ``make reference`` (``python
docs/hooks.py``) and by every docs build, which warns when it had to (so a
strict build, as ``make test`` runs it, fails on a stale committed page;
``tests/test_reference_pages.py`` says the same):

- ``<!-- reference: config -->``: every key of waypost's config schema
  (``src/waypost/schemas/config.schema.yaml``, as merged for a workflow
  with an axis);
- ``<!-- reference: workers -->``: the worker pools file's schema;
- ``<!-- reference: workflow-config PATH -->``: the keys a workflow's own
  schema adds (PATH relative to the repository);
- ``<!-- reference: cli -->``: every ``waypost`` command and option, from
  the argparse parser;

each block ending with ``<!-- /reference -->``. A schema key without a
description fails the generation.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import tempfile

from waypost.cli import main as cli
from waypost.model import config as wconfig
from waypost.model import policy

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(REPO, "docs")
BEGIN = re.compile(r"^<!-- reference: ([a-z-]+)(?: (\S+))? -->$", re.M)
END = "<!-- /reference -->"
NOTE = ("<!-- generated from the code by `make reference` (and by every docs build): edit the code, "
        "not the text up to the end marker -->")
AXIS = wconfig.Axis("<axis>", "<axis>s")   # the reference is for any workflow's axis word
HELP_WIDTH = "100"   # argparse wraps help to the terminal's width: the pages are made at this one
log = logging.getLogger("mkdocs.hooks.reference")


def expand(kind: str, arg: str | None, where: str) -> str:
    """The generated text of one block."""
    if kind == "config":
        with tempfile.TemporaryDirectory() as empty:   # a workflow without a schema of its own
            schema = wconfig.schema_for(empty, AXIS)
        # defaults the engine applies itself (a stage's policy merges over the global one, key by key)
        implied = {"policy": policy.DEFAULTS, "retention": schema["properties"]["retention"]["default"]}
        return schema_reference(schema, "config", implied)
    if kind == "workers":
        return schema_reference(wconfig.load_yaml(os.path.join(
            REPO, "src", "waypost", "schemas", "workers.schema.yaml")), "workers")
    if kind == "workflow-config":
        return schema_reference(wconfig.load_yaml(os.path.join(REPO, arg)), "workflow", defs_heading=False)
    if kind == "cli":
        return cli_reference()
    raise ValueError(f"{where}: unknown reference marker {kind!r}")


def regenerate(text: str, where: str) -> str:
    """A page with each of its generated blocks made again."""
    out, at = [], 0
    for begin in BEGIN.finditer(text):
        if begin.start() < at:
            continue
        end = text.find("\n" + END, begin.end())
        if end < 0:
            raise ValueError(f"{where}: {begin.group(0)} has no {END} line after it")
        generated = expand(begin.group(1), begin.group(2), where).rstrip("\n")
        out += [text[at:begin.end()], "\n", NOTE, "\n\n", generated, "\n"]
        at = end + 1
    return "".join(out) + text[at:]


def pages(docs_dir: str = DOCS) -> list[str]:
    """The pages (relative to ``docs_dir``) that hold generated blocks."""
    found = []
    for folder, _, files in os.walk(docs_dir):
        for name in sorted(files):
            path = os.path.join(folder, name)
            if name.endswith(".md"):
                with open(path, encoding="utf-8") as f:
                    if BEGIN.search(f.read()):
                        found.append(os.path.relpath(path, docs_dir))
    return sorted(found)


def write_pages(docs_dir: str = DOCS, out_dir: str | None = None) -> list[str]:
    """Each page with generated blocks made again, written to ``out_dir``
    (the same relative paths), or in place where it changed; the pages
    whose committed text was stale."""
    stale = []
    for page in pages(docs_dir):
        with open(os.path.join(docs_dir, page), encoding="utf-8") as f:
            text = f.read()
        fresh = regenerate(text, page)
        if fresh != text:
            stale.append(page)
        target = os.path.join(out_dir or docs_dir, page)
        if out_dir or fresh != text:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "w", encoding="utf-8") as f:
                f.write(fresh)
    return stale


def on_pre_build(config) -> None:
    for page in write_pages(config["docs_dir"]):
        log.warning(f"docs/{page}: its generated reference was stale and is written again: commit it "
                    "(`make reference` does the same)")


# -- schemas ----------------------------------------------------------------

def schema_reference(schema: dict, anchor: str, implied: dict | None = None, defs_heading: bool = True) -> str:
    """A table of the top-level keys, then one table per definition a key
    refers to (policy, resources, ...), each under its own anchor."""
    defs = schema.get("$defs", {})
    out = [_table(list(_rows(schema, "", anchor)))]
    used = _used_defs(schema, defs)
    for name in (n for n in used if defs[n].get("properties")):
        node = defs[name]
        out += ["", f"### `{name}` {{#{anchor}-{name}}}", "", _describe(node, required=True, where=name), "",
                _table(list(_rows(node, "", anchor, (implied or {}).get(name, {}))))]
    simple = [n for n in used if not defs[n].get("properties")]
    if simple and defs_heading:
        out += ["", "### Value types", ""]
        for name in simple:
            out.append(f"- <a id=\"{anchor}-{name}\"></a>`{name}` ({_type(defs[name], anchor)}): "
                       f"{_describe(defs[name], required=True, where=name)}{_constraints(defs[name])}")
    return "\n".join(out) + "\n"


def _used_defs(schema: dict, defs: dict) -> list[str]:
    seen: list[str] = []

    def walk(node):
        if isinstance(node, dict):
            ref = node.get("$ref", "")
            if ref.startswith("#/$defs/"):
                name = ref.rsplit("/", 1)[1]
                if name not in seen:
                    seen.append(name)
                    walk(defs[name])
            for key, value in node.items():
                if key != "$defs":
                    walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)
    walk(schema)
    return seen


def _rows(node: dict, prefix: str, anchor: str, implied: dict | None = None):
    required = set(node.get("required", []))
    for key, sub in (node.get("properties") or {}).items():
        path = f"{prefix}{key}"
        container = bool(sub.get("properties")) or isinstance(sub.get("additionalProperties"), dict)
        if implied and key in implied and "default" not in sub:
            sub = {**sub, "default": implied[key]}
        yield path, _type(sub, anchor), _default(sub, key in required), _describe(sub, not container, path)
        if "$ref" not in sub:
            if sub.get("properties"):
                yield from _rows(sub, path + ".", anchor)
            extra = sub.get("additionalProperties")
            if isinstance(extra, dict) and extra.get("properties"):
                yield from _rows(extra, f"{path}.<name>.", anchor)
            items = sub.get("items")
            if isinstance(items, dict) and items.get("properties"):
                yield from _rows(items, f"{path}[].", anchor)


def _type(node: dict, anchor: str) -> str:
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[1]
        return f"[{name}](#{anchor}-{name})"
    if "enum" in node:
        return " \\| ".join(f"`{json.dumps(v)}`" for v in node["enum"])
    if "oneOf" in node or "anyOf" in node:
        return " or ".join("{" + ", ".join(f"`{key}`" for key in alt["properties"]) + "}"
                           if alt.get("type") == "object" and alt.get("properties") else _type(alt, anchor)
                           for alt in node.get("oneOf") or node["anyOf"])
    kind = node.get("type", "any")
    if isinstance(kind, list):
        kind = " or ".join(kind)
    if kind == "array" and isinstance(node.get("items"), dict):
        return f"list of {_type(node['items'], anchor)}"
    if kind == "object" and isinstance(node.get("additionalProperties"), dict) and not node.get("properties"):
        return f"mapping of name → {_type(node['additionalProperties'], anchor)}"
    return kind


def _default(node: dict, required: bool) -> str:
    if required:
        return "required"
    if "default" in node:
        return f"`{json.dumps(node['default'])}`"
    return ""


def _describe(node: dict, required: bool = False, where: str = "") -> str:
    text = " ".join((node.get("description") or node.get("title") or "").split())
    if not text and "$ref" not in node and required:
        raise ValueError(f"schema key {where!r} has no description: add one to the schema")
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def _constraints(node: dict) -> str:
    bits = [f"{k} {node[k]}" for k in ("minimum", "exclusiveMinimum", "maximum", "minLength") if k in node]
    if "pattern" in node:
        bits.append(f"pattern `{node['pattern']}`")
    return f" ({', '.join(bits)})" if bits else ""


def _table(rows: list[tuple]) -> str:
    lines = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for path, kind, default, text in rows:
        lines.append(f"| `{path}` | {kind} | {default} | {text} |")
    return "\n".join(lines)


# -- the command line --------------------------------------------------------

def cli_reference() -> str:
    width = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_WIDTH
    try:
        with tempfile.TemporaryDirectory() as elsewhere:       # no workflow's recorded axis: --pair
            here = os.getcwd()
            os.chdir(elsewhere)
            try:
                parser = cli.build_parser()
            finally:
                os.chdir(here)
        out = [_fenced(parser.format_help())]
        for name, sub in _subcommands(parser):
            out += ["", f"### `waypost {name}`", "", _escape(sub.description or ""), "",
                    _fenced(sub.format_usage().replace("usage: ", "")), "", _options(sub)]
    finally:
        if width is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = width
    return "\n".join(out) + "\n"


def _subcommands(parser: argparse.ArgumentParser, prefix: str = ""):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                sub.description = sub.description or helps.get(name)
                nested = any(isinstance(a, argparse._SubParsersAction) for a in sub._actions)
                if nested:
                    yield from _subcommands(sub, f"{prefix}{name} ")
                else:
                    yield f"{prefix}{name}", sub


def _options(parser: argparse.ArgumentParser) -> str:
    lines = ["| argument | meaning |", "|---|---|"]
    for action in parser._actions:
        if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
            continue
        flags = ", ".join(f"`{f}`" for f in action.option_strings) or f"`{action.dest}`"
        if action.metavar and action.option_strings:
            flags += f" `{action.metavar}`"
        text = (action.help or "") % {"default": action.default} if action.help else ""
        if action.required and action.option_strings:
            text = f"(required) {text}"
        lines.append(f"| {flags} | {_escape(text)} |")
    return "\n".join(lines)


def _escape(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def _fenced(text: str) -> str:
    return f"```text\n{text.rstrip()}\n```"


if __name__ == "__main__":   # make reference: the committed pages made again
    stale = write_pages()
    print("\n".join(f"wrote docs/{page}" for page in stale) or "the reference pages are current")
    sys.exit(0)
