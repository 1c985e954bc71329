"""One table over every dataset's fit (a fit that is missing is said so)."""
import argparse
import json
import os

parser = argparse.ArgumentParser()
parser.add_argument("models", nargs="*")
parser.add_argument("--output", required=True)
args = parser.parse_args()

lines = ["| dataset | slope | intercept | points |", "| --- | ---: | ---: | ---: |"]
for path in args.models:
    dataset = path.split(os.sep)[-4]   # {root}/{dataset}/{experiment}/fit/model.json
    try:
        with open(path) as f:
            fit = json.load(f)
        lines.append(f"| {dataset} | {fit['slope']:.3f} | {fit['intercept']:.3f} | {fit['points']} |")
    except (OSError, ValueError, KeyError):
        lines.append(f"| {dataset} | – | – | (no fit) |")
with open(args.output, "w") as f:
    f.write("\n".join(["# Fits", "", *lines]) + "\n")
