#!/usr/bin/env python3
"""1-D heat equation on a rod (explicit finite differences), with checkpoints.

u_t = alpha * u_xx on [0, 1], u(0) = u(1) = 0, u(x, 0) = sin(pi x); the exact
solution is sin(pi x) * exp(-alpha pi^2 t), so every run knows its own error.
The time step is the stability limit dx^2 / (2 alpha) times 0.9, so the work
grows with alpha * cells^3: a parameter grid has cheap and expensive points.

A checkpoint (step, time, field) is written atomically every
--checkpoint-every steps into --checkpoint-dir; a new run resumes from the
latest one. --bad-node-after N makes the first attempt (WAYPOST_ATTEMPT=1)
die by SIGKILL after N steps, the way a failing node takes a job away.
"""

import argparse
import glob
import json
import math
import os
import signal
import sys
import tempfile


def write_json(path, data):
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=".tmp-")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def latest_checkpoint(directory):
    files = sorted(glob.glob(os.path.join(directory, "step-*.json")))
    for path in reversed(files):
        try:
            with open(path) as f:
                return json.load(f)
        except (OSError, ValueError):
            continue  # a torn checkpoint: use the one before
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--alpha", type=float, required=True)
    parser.add_argument("--cells", type=int, required=True)
    parser.add_argument("--t-end", type=float, default=0.1)
    parser.add_argument("--checkpoint-every", type=int, default=200)
    parser.add_argument("--checkpoint-dir", required=True)
    parser.add_argument("--bad-node-after", type=int, default=0)
    parser.add_argument("--output", required=True)
    args = parser.parse_args()
    if args.alpha <= 0 or args.cells < 3:
        sys.exit("error: alpha must be > 0 and cells >= 3")

    dx = 1.0 / args.cells
    dt = 0.9 * dx * dx / (2 * args.alpha)
    total = math.ceil(args.t_end / dt)
    os.makedirs(args.checkpoint_dir, exist_ok=True)
    state = latest_checkpoint(args.checkpoint_dir)
    if state and (state["alpha"], state["cells"]) == (args.alpha, args.cells):
        step, u = state["step"], state["u"]
        print(f"resuming from step {step}/{total}", file=sys.stderr)
    else:
        step, u = 0, [math.sin(math.pi * i * dx) for i in range(args.cells + 1)]
    crash = args.bad_node_after if os.environ.get("WAYPOST_ATTEMPT", "1") == "1" else 0
    r = args.alpha * dt / (dx * dx)
    while step < total:
        u = [0.0] + [u[i] + r * (u[i - 1] - 2 * u[i] + u[i + 1]) for i in range(1, args.cells)] + [0.0]
        step += 1
        if step % args.checkpoint_every == 0 or step == total:
            write_json(os.path.join(args.checkpoint_dir, f"step-{step:08d}.json"),
                       {"alpha": args.alpha, "cells": args.cells, "step": step, "t": step * dt, "u": u})
            print(f"step {step}/{total} t={step * dt:.5f}", file=sys.stderr, flush=True)
        if crash and step >= crash:
            print(f"bad node: killed at step {step}", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
    t = total * dt
    exact = [math.sin(math.pi * i * dx) * math.exp(-args.alpha * math.pi ** 2 * t) for i in range(args.cells + 1)]
    error = max(abs(a - b) for a, b in zip(u, exact))
    write_json(args.output, {"alpha": args.alpha, "cells": args.cells, "steps": total, "t": t,
                             "peak": max(u), "exact_peak": max(exact), "max_error": error})
    print(f"done: {total} steps, max error {error:.2e}", file=sys.stderr)


if __name__ == "__main__":
    main()
