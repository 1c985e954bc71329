"""Write a CSV of (x, y) points on a line, with noise; the slope depends on the dataset."""
import argparse
import random
import zlib

parser = argparse.ArgumentParser()
parser.add_argument("--dataset", required=True)
parser.add_argument("--rows", type=int, required=True)
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--output", required=True)
args = parser.parse_args()

rng = random.Random(args.seed)
slope = 1 + zlib.crc32(args.dataset.encode()) % 5
with open(args.output, "w") as f:
    f.write("x,y\n")
    for _ in range(args.rows):
        x = rng.uniform(0, 10)
        f.write(f"{x:.4f},{slope * x + rng.gauss(0, 1):.4f}\n")
