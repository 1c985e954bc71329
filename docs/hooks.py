"""MkDocs hooks: the reference pages' tables, generated at build time from
the code, so they can't drift from it.

A page asks for one with a marker line:

- ``<!-- reference: config -->``: every key of waypost's config schema
  (``src/waypost/schemas/config.schema.yaml``, as merged for a workflow
  with an axis);
- ``<!-- reference: workers -->``: the worker pools file's schema;
- ``<!-- reference: workflow-config PATH -->``: the keys a workflow's own
  schema adds (PATH relative to the repository);
- ``<!-- reference: cli -->``: every ``waypost`` command and option, from
  the argparse parser.

A schema key without a description fails the build (mkdocs runs strict).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile

from waypost import cli, policy
from waypost import config as wconfig

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARKER = re.compile(r"^<!-- reference: ([a-z-]+)(?: (\S+))? -->$", re.M)
AXIS = wconfig.Axis("<axis>", "<axis>s")   # the reference is for any workflow's axis word


def on_page_markdown(markdown: str, page, config, files) -> str:
    def expand(match: re.Match) -> str:
        kind, arg = match.group(1), match.group(2)
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
        raise ValueError(f"{page.file.src_path}: unknown reference marker {match.group(0)!r}")
    return MARKER.sub(expand, markdown)


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
        return " or ".join(_type(alt, anchor) for alt in node.get("oneOf") or node["anyOf"])
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


if __name__ == "__main__":   # print the generated tables, to look at them without a build
    print(schema_reference(wconfig.schema_for(tempfile.mkdtemp(), AXIS), "config", {"policy": policy.DEFAULTS}))
    print(schema_reference(wconfig.load_yaml(os.path.join(REPO, "src/waypost/schemas/workers.schema.yaml")), "workers"))
    print(cli_reference())
