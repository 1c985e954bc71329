"""What a forked step runner costs, in user and kernel CPU (issue 57 item 2),
against the bare process operations it is made of::

    .venv/bin/python -S benchmarks/fork_cost.py [--steps N] [--rounds R]

As the local step server and a Slurm bundle do, this process imports the
runner once (``forked.preload``), then forks a runner per no-op step
(``touch`` of its one output, each in a fresh stage directory) and waits
for it; the children's CPU, user and kernel apart, and their minor page
faults come from ``getrusage``. Alongside, from the same process: a bare
fork and exit, a fork of a fork (the runner forks the step's watchdog),
fork + exec ``true``, fork + exec ``bash -c 'touch F; :'`` (the step's
command), and the same started as ``subprocess`` starts it (``vfork``).
Variants alternate over ``--rounds``, the runner also after
``gc.freeze()`` (the collector then leaves the inherited objects' pages
alone; ``gc.unfreeze()`` after it).
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

from waypost.model import spec
from waypost.runner import attempt
from waypost.runner import main as _runner  # noqa: F401  (imported once, as the server does)
from waypost.runner.forked import Forked, preload


def children_cpu(label: str, count: int, one) -> None:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    for i in range(count):
        one(i)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    user = (after.ru_utime - before.ru_utime) / count * 1000
    kernel = (after.ru_stime - before.ru_stime) / count * 1000
    faults = (after.ru_minflt - before.ru_minflt) / count
    print(f"{label:<36} {user + kernel:6.2f} ms  (user {user:5.2f}, kernel {kernel:5.2f})  "
          f"{faults:6.0f} minor faults", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    preload()
    work = tempfile.mkdtemp(prefix="waypost-fork-cost-")
    null = os.open(os.devnull, os.O_WRONLY)
    made = iter(range(10**9))

    def step(_: int) -> None:
        directory = os.path.join(work, f"s{next(made)}")
        os.mkdir(directory)
        line = spec.encode({"stage": "s", "experiment": "e", "pair": "p", "stage_dir": directory,
                            "outputs": [directory + "/out"]})
        body = f"{line}\ntouch {directory}/out\n".encode()
        status = Forked(body, attempt.FORWARDED_SIGNALS, lambda: (os.dup2(null, 1), os.dup2(null, 2))).wait()
        if status != 0:
            raise SystemExit(f"a no-op step ended {status}")

    def forked(child) -> None:
        pid = os.fork()
        if pid == 0:
            try:
                child()
            finally:
                os._exit(0)
        os.waitpid(pid, 0)

    target = os.path.join(work, "touched")
    parts = {
        "fork, exit": lambda _: forked(lambda: None),
        "fork of a fork, exit": lambda _: forked(lambda: forked(lambda: None)),
        "fork, exec true": lambda _: forked(lambda: os.execv("/bin/true", ["true"])),
        "fork, exec bash -c touch": lambda _: forked(
            lambda: os.execv("/bin/bash", ["bash", "-c", f"touch {target}; :"])),
        "subprocess (vfork) bash -c touch": lambda _: subprocess.run(["/bin/bash", "-c", f"touch {target}; :"]),
    }
    try:
        for number in range(args.rounds):
            print(f"round {number + 1}")
            children_cpu("forked runner, no-op step", args.steps, step)
            gc.freeze()
            children_cpu("the same, after gc.freeze()", args.steps, step)
            gc.unfreeze()
            for label, one in parts.items():
                children_cpu(label, args.steps, one)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
