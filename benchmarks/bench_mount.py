"""A bucket mounted as the root (issue 29): rclone's FUSE mount of
fake-gcs-server, as a node mounts its gcsfuse bucket.

- Reuse of a 100 MB stage into another experiment on the mount, the way a
  reuse job does it (``StageStore.bring``): with the bucket known (from the
  mount table: a server-side copy, checked by crc32c) against a plain copy
  through the mount (a mount waypost can't map). Bytes through the node are
  the bytes that crossed the loopback interface meanwhile (every byte between
  this machine and the emulator: the mount's and the API's).
- ``waypost status`` over ~2,000 stage directories on the mount (one API
  listing, the manifests read in one batch) against the same bucket as a
  gs:// root.

Needs root, rclone and fuse3 (``make test`` installs them); skipped
otherwise. Run alone: ``.venv/bin/python benchmarks/bench_mount.py``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "tests"))
import fake_gcs
from common import (
    BIN,
    REPO,
    Row,
    Section,
    build_done_tree,
    check,
    interleaved,
    log,
    median,
    reference_config,
    run_parts,
    show,
    timed,
    write_config,
)

REUSE_MB = int(os.environ.get("BENCH_MOUNT_MB", "100"))
STATUS_PAIRS = 50             # 2 experiments × 50 pairs × 20 stage dirs + 2 reports = 2,002
REPETITIONS = 3


def loopback_bytes() -> int:
    """Bytes received on the loopback interface so far (/proc/net/dev)."""
    for line in Path("/proc/net/dev").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name.strip() == "lo":
            return int(rest.split()[0])
    raise RuntimeError("no loopback interface in /proc/net/dev")


def reuse_part(tmp: Path) -> tuple[list[Row], list[str]]:
    from waypost import stores
    from waypost.model import manifest
    from waypost.stores.mounted import MountedStore, PlainMountStore
    bucket = "bench-mount-reuse"
    with fake_gcs.running() as url:
        from waypost.stores import gcs
        gcs.filesystem(f"gs://{bucket}")[0].mkdir(bucket)
        with fake_gcs.mounted(url, bucket, tmp / "mnt", tmp / "rclone") as point:
            root = point / "results"
            source = root / "en-de" / "exp1" / "train_student"
            source.mkdir(parents=True)
            block = os.urandom(1 << 20)
            with open(source / "model.bin", "wb") as f:
                for _ in range(REUSE_MB):
                    f.write(block)
            outputs = manifest.describe_outputs(str(source), [str(source / "model.bin")])
            store = stores.store_for(str(root))
            assert isinstance(store, MountedStore), type(store)
            from_store = stores.store_for(str(source))
            round_no = [0]

            def reuse(target_store):
                def go():
                    round_no[0] += 1
                    target = root / "en-de" / f"exp{round_no[0] + 1}" / "train_student"
                    before, started = loopback_bytes(), time.perf_counter()
                    how, _ = target_store.bring(from_store, str(source), str(target), outputs)
                    seconds = time.perf_counter() - started
                    moved[target_store is store].append(loopback_bytes() - before)
                    assert how == ("copied in the bucket" if target_store is store else "copied"), how
                    return seconds
                return go
            moved = {True: [], False: []}
            samples = interleaved({"declared": reuse(store), "plain": reuse(PlainMountStore(str(root)))},
                                  REPETITIONS, warmup=0)
    declared, plain = median(samples["declared"]), median(samples["plain"])
    bytes_declared, bytes_plain = median(moved[True]) / 1e6, median(moved[False]) / 1e6
    log(f"mount reuse: {declared:.2f}s ({bytes_declared:.1f} MB) vs plain {plain:.2f}s ({bytes_plain:.0f} MB)")
    label = f"reuse of a {REUSE_MB} MB stage on the mount"
    rows = [
        Row(measure=f"{label}: time, bucket known vs a plain copy through the mount", value=declared, unit="s",
            baseline=plain, baseline_label="plain copy through the mount (`shutil.copyfile`, then sha256)",
            target="(informational)", samples=samples,
            note="the bucket's server-side copy, checked by crc32c"),
        Row(measure=f"{label}: bytes through the node, bucket known vs a plain copy", value=bytes_declared,
            unit="MB", baseline=bytes_plain, baseline_label="plain copy through the mount",
            target="0 with the bucket known (requests only)", met=bytes_declared < 1.0,
            note="bytes over the loopback interface to the emulator while each ran (the mount's and the "
                 "API's: both are this node's network traffic to GCS)"),
    ]
    return rows, []


def status_part(tmp: Path) -> tuple[list[Row], list[str]]:
    bucket = "bench-mount-status"
    config = reference_config(STATUS_PAIRS)
    data = tmp / "data"
    config["root"] = f"{bucket}/results"
    count = build_done_tree(data, config)
    log(f"mount status: starting fake-gcs-server with {count:,} stage dirs")
    with fake_gcs.running(data=data, timeout=120) as url, \
            fake_gcs.mounted(url, bucket, tmp / "mnt", tmp / "rclone", dir_cache="60s") as point:
        env = {"STORAGE_EMULATOR_HOST": url, "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}
        work = {}
        for name, root in (("mount", str(point / "results")), ("gs", f"gs://{bucket}/results")):
            work[name] = tmp / name
            write_config(work[name], {**config, "root": root})

        def cmd(name: str) -> list[str]:
            return [str(BIN / "waypost"), "status", "--json", "--config", str(work[name] / "config.yaml"),
                    "--workflow", str(REPO / "workflow")]
        for name in work:   # both see every stage done
            grid = json.loads(check(timed(cmd(name), cwd=work[name], env=env), f"status {name}").output)
            states = {c["state"] for e in grid["experiments"].values() for p in e.values() for c in p.values()}
            assert states == {"SUCCESS"}, (name, states)
        samples = interleaved({name: (lambda n=name: check(timed(cmd(n), cwd=work[n], env=env,
                                                                 keep_output=False), n).seconds)
                               for name in work}, REPETITIONS)
    mount, gs = median(samples["mount"]), median(samples["gs"])
    log(f"mount status: {mount:.2f}s vs gs:// {gs:.2f}s")
    return [Row(measure=f"`waypost status --json`, {count:,} stage dirs on the mount", value=mount, unit="s",
                baseline=gs, baseline_label="the same bucket as a gs:// root", target="(informational)",
                samples=samples, note="the mounted root is listed through the bucket's API, as gs:// is")], []


def run(ctx: dict) -> Section:
    problem = fake_gcs.mount_problem()
    if problem:
        return Section("Mounted bucket", skipped=f"skipped: {problem}")
    return run_parts("Mounted bucket", ctx, (reuse_part, status_part))


if __name__ == "__main__":
    show(run({}))
