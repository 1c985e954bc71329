#!/usr/bin/env python3
"""Summary of a parameter study: one row per instance, failed ones included."""

import argparse
import json


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("extracts", nargs="*", help="every point's extract.json")
    parser.add_argument("--output", required=True)
    args = parser.parse_args()
    rows = []
    for path in args.extracts:
        try:
            with open(path) as f:
                rows.append(json.load(f))
        except (OSError, ValueError):
            rows.append({"instance": path, "state": "missing"})
    done = sum(1 for r in rows if r.get("complete"))
    lines = [f"# Parameter study: {done}/{len(rows)} instances complete", "",
             "| instance | alpha | cells | state | attempts (actions) | t reached | max error |",
             "| --- | ---: | ---: | --- | --- | ---: | ---: |"]
    for r in rows:
        actions = ", ".join(f"{a}:{s}" for a, s in zip(r.get("actions", []), r.get("attempt_states", [])))
        error = f"{r['max_error']:.2e}" if r.get("max_error") is not None else "–"
        lines.append(f"| {r['instance']} | {r.get('alpha', '–')} | {r.get('cells', '–')} | {r.get('state')} | "
                     f"{r.get('attempts', 0)} ({actions}) | {r.get('t', 0):.4f} | {error} |")
    with open(args.output, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
