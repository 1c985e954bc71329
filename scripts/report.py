#!/usr/bin/env python3
"""Summarise the evaluation of an experiment as Markdown and HTML tables.

Each --entry PAIR MODEL METRICS_JSON adds one row: the BLEU and chrF that
evaluate.py wrote to METRICS_JSON for model MODEL of language pair PAIR.
Rows are grouped by pair (sorted), models in the order given.  A metrics file that is missing,
unreadable or lacks numeric 'bleu'/'chrf' does not stop the report: its row
shows the pair and model with state "missing" (the reason goes to stderr),
so a report can be made over pairs some of which failed.

The HTML page is self-contained (inline CSS, no scripts or external assets).
Both outputs are deterministic: no dates or absolute paths are embedded.
"""

import argparse
import html
import json
import numbers
import os

import mtlib


def read_manifest(stage_dir):
    try:
        with open(os.path.join(stage_dir, "_manifest.json"), encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def local_copy(stage_dir):
    """Where to read a stage dir a manifest names. On a gs:// root manifests
    name their inputs by gs:// URL; the step runner keeps local copies of
    gs://BUCKET/KEY at $WAYPOST_MIRROR/BUCKET/KEY, the manifests a failure
    chase needs among them. Other paths as they are."""
    mirror = os.environ.get("WAYPOST_MIRROR")
    if mirror and stage_dir.startswith("gs://"):
        return os.path.join(mirror, stage_dir[len("gs://"):])
    return stage_dir


def root_failure(stage_dir, seen=None):
    """The stage that failed first upstream of ``stage_dir`` (following the
    inputs of skipped stages), as 'stage STATE (n attempts)', or None.

    waypost writes a ``_manifest.json`` beside every stage's outputs; a stage
    that did not succeed says so there, and a skipped one lists the inputs
    whose state blocked it (on a gs:// root: see ``local_copy``).
    """
    seen = seen or set()
    data = read_manifest(stage_dir)
    if not data or data.get("state") == "SUCCESS" or stage_dir in seen:
        return None
    seen.add(stage_dir)
    if data.get("state") == "SKIPPED":
        for entry in data.get("inputs", []):
            if entry.get("state") not in ("SUCCESS", "ADOPTED"):
                found = root_failure(local_copy(os.path.dirname(entry["path"])), seen)
                if found:
                    return found
    attempts = len([a for a in data.get("attempts", []) if a.get("series") == data["attempts"][-1].get("series")]) \
        if data.get("attempts") else 0
    name = data.get("stage", "?") + (f"/{data['instance']}" if data.get("instance") else "")
    series = len({a.get("series", 1) for a in data.get("attempts", [])})
    given_up = f", given up after {series} series" if data.get("given_up") else ""
    return f"{name} {data['state']} ({attempts} attempt{'s' if attempts != 1 else ''}{given_up})"


def load_row(pair, model, path):
    """One table row; state is 'ok', 'failed: <stage STATE>' or 'missing'."""
    row = {"pair": pair, "model": model, "path": path, "state": "missing",
           "bleu": None, "chrf": None, "direction": None, "sentences": None, "reason": None}
    failure = root_failure(os.path.dirname(path))
    if failure:
        row.update(state=f"failed: {failure}", reason=failure)
        return row
    try:
        with open(path, encoding="utf-8") as handle:
            metrics = json.load(handle)
    except FileNotFoundError:
        row["reason"] = "file not found"
        return row
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        row["reason"] = f"unreadable ({exc.__class__.__name__}: {exc})"
        return row
    if not isinstance(metrics, dict) or not all(
        isinstance(metrics.get(key), numbers.Real) and not isinstance(metrics.get(key), bool)
        for key in ("bleu", "chrf")
    ):
        row["reason"] = "no numeric 'bleu' and 'chrf'"
        return row
    row.update(state="ok", bleu=float(metrics["bleu"]), chrf=float(metrics["chrf"]),
               direction=metrics.get("direction"), sentences=metrics.get("sentences"))
    return row


def fmt(value, digits=2):
    return "–" if value is None else f"{value:.{digits}f}"


def md_cell(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_markdown(experiment, rows):
    ok = sum(row["state"] == "ok" for row in rows)
    lines = [
        f"# Experiment report: {md_cell(experiment)}",
        "",
        f"{len(rows)} entries, {ok} evaluated, {len(rows) - ok} failed or missing.",
        "",
        "| Pair | Model | Direction | BLEU | chrF | Sentences | State |",
        "| --- | --- | --- | ---: | ---: | ---: | --- |",
    ]
    for row in rows:
        lines.append(
            f"| {md_cell(row['pair'])} | {md_cell(row['model'])} | {md_cell(row['direction'] or '–')} | "
            f"{fmt(row['bleu'])} | {fmt(row['chrf'])} | {row['sentences'] if row['sentences'] is not None else '–'} | "
            f"{row['state']} |"
        )
    return "\n".join(lines) + "\n"


CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem; color: #222; }
h1 { font-size: 1.4rem; }
p.summary { color: #555; }
table { border-collapse: collapse; min-width: 40rem; }
th, td { padding: 0.35rem 0.8rem; border-bottom: 1px solid #ddd; text-align: left; }
th { background: #f3f3f3; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.bar { width: 12rem; }
td.bar span { display: block; height: 0.7rem; background: #4a7bd0; border-radius: 2px; }
tr.missing td { color: #a33; background: #fff4f4; }
tr.pair-start td { border-top: 2px solid #bbb; }
""".strip()


def render_html(experiment, rows):
    esc = html.escape
    ok = sum(row["state"] == "ok" for row in rows)
    out = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        f"<title>Experiment report: {esc(experiment)}</title>",
        f"<style>\n{CSS}\n</style>",
        "</head>",
        "<body>",
        f"<h1>Experiment report: {esc(experiment)}</h1>",
        f'<p class="summary">{len(rows)} entries, {ok} evaluated, {len(rows) - ok} failed or missing.</p>',
        "<table>",
        "<thead><tr><th>Pair</th><th>Model</th><th>Direction</th><th>BLEU</th><th></th>"
        "<th>chrF</th><th>Sentences</th><th>State</th></tr></thead>",
        "<tbody>",
    ]
    previous_pair = None
    for row in rows:
        classes = []
        if row["state"] != "ok":
            classes.append("missing")
        if previous_pair is not None and row["pair"] != previous_pair:
            classes.append("pair-start")
        previous_pair = row["pair"]
        class_attr = f' class="{" ".join(classes)}"' if classes else ""
        bar = ""
        if row["bleu"] is not None:
            width = max(0.0, min(100.0, row["bleu"]))
            bar = f'<span style="width: {width:.1f}%"></span>'
        title = f' title="{esc(row["reason"])}"' if row["reason"] else ""
        out.append(
            f"<tr{class_attr}><td>{esc(row['pair'])}</td><td>{esc(row['model'])}</td>"
            f"<td>{esc(row['direction'] or '–')}</td><td class=\"num\">{fmt(row['bleu'])}</td>"
            f'<td class="bar">{bar}</td><td class="num">{fmt(row["chrf"])}</td>'
            f"<td class=\"num\">{esc(str(row['sentences'])) if row['sentences'] is not None else '–'}</td>"
            f"<td{title}>{esc(row['state'])}</td></tr>"
        )
    out += ["</tbody>", "</table>", "</body>", "</html>"]
    return "\n".join(out) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experiment", required=True, help="experiment name shown in the title")
    parser.add_argument("--entry", nargs=3, action="append", required=True,
                        metavar=("PAIR", "MODEL", "METRICS_JSON"),
                        help="one table row; repeat for every pair and model (the file may be missing)")
    parser.add_argument("--output-md", required=True, help="Markdown report to write")
    parser.add_argument("--output-html", required=True, help="HTML report to write")
    args = parser.parse_args()

    seen = set()
    for pair, model, _ in args.entry:
        if not pair.strip() or not model.strip():
            raise mtlib.MTError("--entry PAIR and MODEL must not be empty")
        if (pair, model) in seen:
            raise mtlib.MTError(f"duplicate --entry for pair {pair!r}, model {model!r}")
        seen.add((pair, model))

    # Stable sort: pairs in order, each pair's models in the order given.
    rows = sorted((load_row(*entry) for entry in args.entry), key=lambda row: row["pair"])
    for row in rows:
        if row["state"] != "ok":
            mtlib.log(f"{row['pair']} / {row['model']}: metrics {row['path']} {row['reason']} -> shown as missing")

    mtlib.atomic_write_text(args.output_md, render_markdown(args.experiment, rows))
    mtlib.atomic_write_text(args.output_html, render_html(args.experiment, rows))
    ok = sum(row["state"] == "ok" for row in rows)
    mtlib.log(f"report '{args.experiment}': {len(rows)} rows ({ok} ok, {len(rows) - ok} missing) "
              f"-> {args.output_md}, {args.output_html}")


if __name__ == "__main__":
    mtlib.run_main(main)
