#!/usr/bin/env python3
"""A step that does a little real work (hashes its input chain) and, on a
seeded fraction of attempts, fails the way jobs fail: a non-zero exit, running
past its time limit, a SIGKILL (a bad node), or writing half its output and
crashing. The seed covers instance, attempt and run, so reruns differ."""

import argparse
import hashlib
import os
import random
import signal
import sys
import time


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--instance", required=True)
    parser.add_argument("--input", action="append", default=[])
    parser.add_argument("--output", required=True)
    parser.add_argument("--failure-rate", type=float, default=0.2)
    parser.add_argument("--permanent-rate", type=float, default=0.0,
                        help="the share of instances that fail on every attempt of every run")
    args = parser.parse_args()
    if int(hashlib.sha256(f"permanent:{args.instance}".encode()).hexdigest(), 16) % 10000 < args.permanent_rate * 10000:
        print("injected failure: this instance always fails", file=sys.stderr, flush=True)
        sys.exit(4)
    seed = f"{args.instance}:{os.environ.get('WAYPOST_ATTEMPT')}:{os.environ.get('SOAK_RUN', '0')}"
    rng = random.Random(seed)
    digest = hashlib.sha256(args.instance.encode())
    for path in args.input:
        with open(path, "rb") as f:
            digest.update(f.read())
    if rng.random() < args.failure_rate:
        how = rng.choice(["exit", "timeout", "sigkill", "partial"])
        print(f"injected failure: {how}", file=sys.stderr, flush=True)
        if how == "exit":
            sys.exit(3)
        if how == "timeout":
            time.sleep(60)  # the policy's runtime ends it long before
        if how == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        with open(args.output, "w") as f:  # partial: half an output, then a crash
            f.write(digest.hexdigest()[:10])
        os.kill(os.getpid(), signal.SIGKILL)
    with open(args.output, "w") as f:
        f.write(digest.hexdigest() + "\n")


if __name__ == "__main__":
    main()
