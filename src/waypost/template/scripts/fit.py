"""Fit y = a·x + b to a CSV of points by least squares; write a and b as JSON."""
import argparse
import csv
import json

parser = argparse.ArgumentParser()
parser.add_argument("--data", required=True)
parser.add_argument("--output", required=True)
args = parser.parse_args()

with open(args.data) as f:
    points = [(float(row["x"]), float(row["y"])) for row in csv.DictReader(f)]
n = len(points)
mx = sum(x for x, _ in points) / n
my = sum(y for _, y in points) / n
a = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)
with open(args.output, "w") as f:
    json.dump({"slope": a, "intercept": my - a * mx, "points": n}, f, indent=2)
