#!/usr/bin/env python3
"""Extract what a simulation reached, whatever state it ended in.

Reads the simulation's stage manifest (written by waypost) for its state and
attempts; takes the final result when the simulation succeeded, else the
latest checkpoint it left (a partial result), else nothing.
"""

import argparse
import glob
import json
import os


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--simulation", required=True, help="the simulation's result.json")
    parser.add_argument("--instance", required=True)
    parser.add_argument("--output", required=True)
    args = parser.parse_args()
    stage_dir = os.path.dirname(args.simulation)
    manifest = load(os.path.join(stage_dir, "_manifest.json")) or {}
    attempts = manifest.get("attempts", [])
    row = {"instance": args.instance, "state": manifest.get("state", "ADOPTED"),
           "attempts": len(attempts), "actions": [a.get("action") for a in attempts],
           "attempt_states": [a.get("state") for a in attempts]}
    result = load(args.simulation) if manifest.get("state", "SUCCESS") == "SUCCESS" else None
    if result:
        row.update(complete=True, **result)
    else:
        checkpoints = sorted(glob.glob(os.path.join(stage_dir, "checkpoints", "step-*.json")))
        last = load(checkpoints[-1]) if checkpoints else None
        row.update(complete=False, t=last["t"] if last else 0.0, steps=last["step"] if last else 0,
                   peak=max(last["u"]) if last else None)
        if last:
            row.update(alpha=last["alpha"], cells=last["cells"])
    with open(args.output, "w") as f:
        json.dump(row, f, indent=1)


if __name__ == "__main__":
    main()
