"""Another team's root is untrusted input (issue 27): no path from a manifest
or a bucket listing leaves its stage directory, and no symbolic link is
followed out of one.

Real runs (Snakemake and the `waypost` CLI) over another team's local root
and bucket whose manifests list outputs that climb out, are absolute or
point through a link; bucket objects whose names hold ``..``; and property
tests (hypothesis) feeding random manifests to every reader, watching every
file they open, stat, write or remove."""

from __future__ import annotations

import builtins
import contextlib
import copy
import hashlib
import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import ClassVar
from unittest import mock

import jsonschema
import pytest
import yaml
from conftest import SMALL_CONFIG, planned, read_manifest, snakemake, waypost, write_config
from conftest import gcs_flags as flags
from conftest import gcs_fs as fs
from conftest import gcs_key as key
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from waypost import stores
from waypost.model import layout, manifest, records, states, trust

PAIRS = ("en-xa", "en-xb")
LEAVES = "which leaves its stage directory; not using this manifest"


# --- helpers ------------------------------------------------------------------

def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def files_below(top: Path) -> dict[str, tuple]:
    """Every entry below a directory, links as links: rel → (kind, size or
    target, sha256, inode)."""
    found = {}
    for path in sorted(top.rglob("*")):
        rel = str(path.relative_to(top))
        if path.is_symlink():
            found[rel] = ("link", os.readlink(path))
        elif path.is_file():
            st_ = path.stat()
            found[rel] = ("file", st_.st_size, sha256(path.read_bytes()), st_.st_ino)
    return found


def own_files(work: Path) -> dict[str, tuple]:
    """``files_below`` a working directory, but waypost's and Snakemake's
    own records (``.waypost/``, ``.snakemake/``)."""
    return {rel: v for rel, v in files_below(work).items() if not rel.startswith(".")}


def plant(stage_dir: Path, rel: str, data: bytes) -> None:
    """List one more output in a stage's manifest, with the size and sha256 of ``data``."""
    record = read_manifest(stage_dir)
    record["outputs"].append({"path": rel, "size": len(data), "sha256": sha256(data)})
    (stage_dir / "_manifest.json").write_text(json.dumps(record, indent=2))


def user_config(root: str = "results", reuse: dict | None = None) -> dict:
    """A user's config: experiment exp2 over both pairs, taking ``reuse`` from elsewhere."""
    config = copy.deepcopy(SMALL_CONFIG)
    config["root"] = root
    config["experiments"] = {"exp2": {"pairs": list(PAIRS), "teachers": 2, **({"reuse": reuse} if reuse else {})}}
    return config


def pointers(stages: tuple[str, ...], root: str, pairs=PAIRS) -> dict:
    """Reuse entries naming another root's stage dirs, as `waypost reuse --from-root` writes them."""
    return {s: {p: layout.join(root, p, "exp1", s) for p in pairs} for s in stages}


@pytest.fixture
def theirs(finished_run, tmp_path) -> Path:
    """Another team's working directory: a finished run, its root ``results``."""
    target = tmp_path / "theirs"
    shutil.copytree(finished_run, target, symlinks=True, copy_function=shutil.copy2)
    return target


@pytest.fixture
def mine(tmp_path) -> Path:
    """The user's working directory, with a file of their own beside the root."""
    work = tmp_path / "mine"
    work.mkdir()
    write_config(work, user_config())
    (work / "notes.md").write_text("my notes\n")
    return work


# --- the path rules -----------------------------------------------------------

@pytest.mark.parametrize("path, why", [
    ("model.bin", None), ("sub/dir/model.bin", None), (".hidden", None), ("..x", None), ("a..b/c", None),
    ("../x", "leaves its stage directory"), ("a/../../x", "leaves its stage directory"), ("..", "leaves"),
    ("/etc/passwd", "absolute"), ("a//b", "normalised"), ("a/./b", "normalised"), (".", "normalised"),
    ("dir/", "normalised"), ("", "empty"), ("a\\..\\b", "backslash"), ("a\x00b", "NUL"),
    ("x" * 5000, "longer than"), ("\ud800", "lone surrogate"), ("a\tb", "control character"),
])
def test_relative_paths(path, why):
    problem = trust.relative_problem(path)
    assert (problem is None) if why is None else (why in problem), problem


@pytest.mark.parametrize("location, ok", [
    ("results/en-xa/exp1/train_vocab/vocab.json", True), ("/data/results/en-xa/exp1/s/f", True),
    ("../shared/results/en-xa/exp1/s/f", True), ("./results/p/e/s/f", True),
    ("gs://bucket/results/en-xa/exp1/s/f", True),
    ("results/p/e/s/../../../../../etc/f", False), ("gs://bucket/results/p/e/s/../../x", False),
    ("gs://bucket/results//p/e/s/f", False), ("gs:///x", False), ("a\x00b", False), ("", False),
])
def test_locations(location, ok):
    assert (trust.location_problem(location) is None) == ok


# --- the reader ---------------------------------------------------------------

def good_record(**changes) -> dict:
    record = records.manifest(created=manifest.now_iso(), experiment="e", pair="p", stage="s", instance=None, state="SUCCESS",
                            attempts=[{"number": 1, "series": 1, "state": "SUCCESS", "workspace": ".",
                                       "log": "_logs/attempt-1.log"}],
                            outputs=[{"path": "out.txt", "size": 3, "sha256": sha256(b"out")}],
                            inputs=[{"path": "root/p/e/up/in.txt", "manifest": "root/p/e/up/_manifest.json",
                                     "state": "SUCCESS", "sha256": sha256(b"in"), "provisional": False}],
                            settings={"k": 1}, config_hash="h", code_version="v")
    record.update(changes)
    return record


BAD = [
    ({"outputs": [{"path": "../../../../workflow/Snakefile", "size": 1, "sha256": "0" * 64}]},
     "manifest lists output '../../../../workflow/Snakefile', which leaves its stage directory"),
    ({"outputs": [{"path": "/home/me/.bashrc", "size": 1, "sha256": "0" * 64}]},
     "manifest lists output '/home/me/.bashrc', which is an absolute path, outside its stage directory"),
    ({"outputs": [{"path": "_manifest.json", "size": 1, "sha256": "0" * 64}]}, "which is waypost's own"),
    ({"outputs": [{"path": "m", "size": 1, "sha256": "0" * 64,
                   "members": [{"path": "m/../../x"}]}]}, "lists directory member 'm/../../x'"),
    ({"attempts": [{"log": "../../../../.ssh/id_rsa"}]}, "lists an attempt's log '../../../../.ssh/id_rsa'"),
    ({"attempts": [{"workspace": "/tmp"}]}, "lists an attempt's workspace '/tmp'"),
    ({"inputs": [{"path": "gs://b/r/p/e/s/../../../../x", "manifest": None}]}, "lists input 'gs://b/r/p/e/s/"),
    ({"inputs": [{"path": "r/p/e/s/f", "manifest": "r/p/e/t/_manifest.json"}]},
     "which is not in the stage directory of its manifest"),
    ({"inputs": [{"path": "r/p/e/s/f", "manifest": "r/p/e/s/notes.txt"}]}, "which is not a _manifest.json"),
    ({"reused_from": "results/p/e/s/../../../../../x"}, "lists reuse source"),
    ({"outputs": [{"path": "a", "size": "12", "sha256": "0" * 64}]},
     "manifest field outputs[0].size is a string, expected an integer"),
    ({"outputs": [{"path": "a", "size": -1, "sha256": "0" * 64}]}, "outputs[0].size is -1"),
    ({"outputs": [{"path": "a", "size": 10 ** 30, "sha256": "0" * 64}]}, "outputs[0].size is absurdly large"),
    ({"outputs": [{"path": "a", "size": True, "sha256": "0" * 64}]}, "is a boolean, expected an integer"),
    ({"outputs": [{"path": "a", "size": 1}]}, "manifest field outputs[0] has no 'sha256'"),
    ({"outputs": [{"path": "a", "size": 1, "sha256": "nope"}]}, "does not match"),
    ({"outputs": {"path": "a"}}, "field outputs is an object, expected a list"),
    ({"attempts": ["one"]}, "field attempts[0] is a string, expected an object"),
    ({"attempts": None}, "field attempts is null, expected a list"),
    ({"state": "DONE"}, "field state is 'DONE', expected one of SUCCESS"),
    ({"settings": {"a": json.loads("[" * 80 + "]" * 80)}}, "nested deeper than 64 levels"),
    ({"next_series_after": "soon"}, "field next_series_after is 'soon'"),
    ({"experiment": "\x1b]0;owned\x07"}, "field experiment is '\\x1b]0;owned\\x07', which does not match"),
    ({"stage": "../../x"}, "field stage is '../../x'"),
    ({"outputs": [{"path": "a\nb", "size": 1, "sha256": "0" * 64}]}, "lists output 'a\\nb', which has a control"),
    ({"outputs": [{"path": "a", "size": 1, "sha256": "0" * 64 + "\n"}]}, "outputs[0].sha256 is"),
]


@pytest.mark.parametrize("change, expected", BAD)
def test_parse_refuses_with_one_line_naming_the_stage_and_the_path(change, expected):
    where = "/their/root/en-de/exp1/train_vocab"
    text = json.dumps(good_record(**change))
    with pytest.raises(manifest.ManifestError) as caught:
        manifest.parse(text, f"{where}/_manifest.json")
    message = str(caught.value)
    assert message.startswith(f"{where}: ") and expected in message and message.endswith("; not using this manifest")
    assert "\n" not in message


@pytest.mark.parametrize("text, expected", [
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (b'{"state": "SUCCESS", "attempts": [], "x": ' + b"1" * 5000 + b"}", "unreadable manifest"),
    (b'{"state": "SUCCESS", "attempts": [], "outputs": [{"path": "a", "size": NaN, "sha256": ""}]}', "NaN"),
    (b'{"state": "SUCCESS", "attempts": [], "outputs": [{"path": "a", "size": 1e400, "sha256": ""}]}',
     "not a finite number"),
    (b"\xff\xfe\x00garbage", "unreadable manifest"),
    (b'["state", "attempts"]', "not a waypost manifest (a list, not an object)"),
    (b'{"attempts": []}', "manifest has no 'state'"),
    (b" " * (trust.MAX_MANIFEST_BYTES + 1), "over the 16 MiB"),
])
@pytest.mark.parametrize("bulk", [False, True])
def test_parse_refuses_what_is_not_a_manifest(text, expected, bulk):
    with pytest.raises(manifest.ManifestError) as caught:
        manifest.parse(text, "/r/p/e/s/_manifest.json", bulk=bulk)
    assert expected in str(caught.value) and "\n" not in str(caught.value)


# --- the catalog's decoder (msgspec) reads exactly as json does ------------------

def decoded(loads, text):
    """What a decoder makes of ``text``: its value (repr: 1 and 1.0 differ), or its error."""
    try:
        return "value", repr(loads(text))
    except (ValueError, RecursionError) as exc:
        return "refused", f"{type(exc).__name__}: {exc}"


def json_loads(text):
    return json.loads(text, parse_constant=manifest._no_constant)


# Where msgspec and json could part: integers past 64 bits (json keeps them),
# 5,000 digits (json refuses), NaN, infinities, a BOM, UTF-16, lone
# surrogates, duplicate keys, deep nesting, bad UTF-8, JSON that isn't.
EDGES = [b"[18446744073709551616]", b"[-9223372036854775809]", b"[" + b"9" * 5000 + b"]", b"[NaN]", b"[-Infinity]",
         b"[1e400]", b"[1.7976931348623159e308]", b"[5e-324]", b"[-0.0]", b"[-0]", b"\xef\xbb\xbf{}",
         '{"a": 1}'.encode("utf-16"), b'["\\ud800"]', b'["\\udc00\\ud800"]', b'{"a": 1, "a": 2}', b'{"\\u0000": 1}',
         b"[" * 5000 + b"]" * 5000, b'"\xff"', b"[1,]", b"[01]", b"[1.]", b"[.5]", b"", b"{} x", '["\ud800"]']


@pytest.mark.parametrize("text", EDGES)
def test_the_bulk_decoder_reads_the_edges_of_json_as_json_does(text):
    assert decoded(manifest._bulk_loads, text) == decoded(json_loads, text)


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
                    lambda children: st.lists(children) | st.dictionaries(st.text(), children), max_leaves=30),
       st.booleans())
@settings(max_examples=300, deadline=None)
def test_the_bulk_decoder_reads_any_json_as_json_does(value, ascii_only):
    text = json.dumps(value, ensure_ascii=ascii_only)
    for form in (text, text.encode("utf-8", "surrogatepass")):
        assert decoded(manifest._bulk_loads, form) == decoded(json_loads, form)


def test_parse_keeps_what_it_does_not_know_and_old_manifests():
    record = good_record(future_field={"nested": [1, 2, {"x": None}]}, attempts=[{"number": 1.0, "anything": [1]}])
    assert manifest.parse(json.dumps(record), "/r/p/e/s/_manifest.json") == record
    minimal = {"state": "FAILED", "attempts": []}   # what the oldest tests write by hand
    assert manifest.parse(json.dumps(minimal), "/r/p/e/s/_manifest.json") == minimal


def test_every_manifest_a_real_run_wrote_is_read_and_fits_the_schema(finished_run):
    validator = jsonschema.Draft202012Validator(manifest.schema())
    found = list((finished_run / "results").rglob("_manifest.json"))
    assert len(found) > 20
    for path in found:
        data = manifest.parse(path.read_bytes(), str(path))
        validator.validate(data)


def test_a_manifest_that_is_a_link_or_no_regular_file_is_not_read(tmp_path):
    stage = tmp_path / "root/p/e/s"
    stage.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps(good_record()))
    (stage / "_manifest.json").symlink_to(elsewhere)
    with pytest.raises(manifest.ManifestError, match=r"a symbolic link .* only from a regular file"):
        manifest.read(str(stage))
    (stage / "_manifest.json").unlink()
    os.mkfifo(stage / "_manifest.json")   # a FIFO would block a plain open()
    with pytest.raises(manifest.ManifestError, match="not a regular file"):
        manifest.read(str(stage))


# --- the schema is a JSON Schema, and jsonschema agrees with the reader ----------

# (no NaN or infinity: JSON has none, and the reader refuses them before the schema)
JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**63, 2**63) | st.floats(allow_nan=False, allow_infinity=False)
                    | st.text(max_size=8),
                    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children,
                                                                                       max_size=3),
                    max_leaves=12)
# Paths a manifest may list: fine ones (files of the stage), and ones that
# reach the files beside the root (OUTSIDE: replaced by its absolute path).
PATHS = st.sampled_from(["out.txt", "sub/model.bin", "../../../../outside/secret.txt", "sub/../../../../../outside",
                         "{OUTSIDE}/secret.txt", "a//b", "_running.json", "", ".", "a\\b", "sub/../out.txt"])
SHA = st.sampled_from(["0" * 64, sha256(b"x"), "xyz", ""])


def field(values):
    """A field's value: mostly of its kind, sometimes anything."""
    return st.one_of(values, values, values, JSON)


OUTPUT = st.fixed_dictionaries({}, optional={"path": field(PATHS), "size": field(st.integers(-2, 2**60)),
                                             "sha256": field(SHA), "crc32c": field(st.sampled_from(["AAAAAA==", "x"])),
                                             "members": field(st.lists(st.fixed_dictionaries({"path": PATHS}),
                                                                       max_size=2))})
ATTEMPT = st.fixed_dictionaries({}, optional={"number": field(st.integers(-1, 5)), "series": field(st.integers(0, 3)),
                                              "state": field(st.sampled_from(["SUCCESS", "FAILED", None])),
                                              "workspace": field(st.sampled_from([".", ".attempts/1", "../..", None])),
                                              "log": field(st.sampled_from(["_logs/a.log", "/etc/shadow", None])),
                                              "slurm_job_id": field(st.sampled_from(["12", 12, None]))})
INPUT = st.fixed_dictionaries({}, optional={
    "path": field(st.sampled_from(["root/p/e/up/in.txt", "root/p/e/up/../../../outside/secret.txt",
                                   "gs://b/r/p/e/s/f", "{OUTSIDE}/secret.txt", "../outside/secret.txt"])),
    "manifest": field(st.sampled_from(["root/p/e/up/_manifest.json", None, "root/p/e/other/_manifest.json",
                                       "{OUTSIDE}/_manifest.json", "../outside/_manifest.json"])),
    "state": field(st.sampled_from(["SUCCESS", "FAILED", "ADOPTED"])), "sha256": field(SHA | st.none()),
    "provisional": field(st.booleans())})
# states as a manifest read from JSON holds them: plain strings (the compiled check reads parsed JSON)
MANIFEST = st.fixed_dictionaries(
    {"state": field(st.sampled_from([s.value for s in states.END_STATES])), "attempts": field(st.lists(ATTEMPT, max_size=2))},
    optional={"outputs": field(st.lists(OUTPUT, max_size=3)), "inputs": field(st.lists(INPUT, max_size=2)),
              "experiment": field(st.just("e")), "pair": field(st.just("p")), "stage": field(st.just("s")),
              "instance": field(st.none()), "settings": field(st.dictionaries(st.text(max_size=4), JSON, max_size=2)),
              "reused_from": field(st.sampled_from(["root/p/e0/s", "root/../../x/../../y", None])),
              "adopted": field(st.booleans()), "provisional": field(st.booleans()),
              "created": field(st.just("2026-01-01T00:00:00.000+00:00")), "series_base": field(st.integers(-1, 3)),
              "next_series_after": field(st.sampled_from(["2026-01-01T00:00:00.000+00:00", "later"])),
              "unknown": JSON})


SCHEMA = manifest.schema()
STRUCTURE = manifest.compile_schema(SCHEMA, paths=False)
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


@settings(max_examples=300, deadline=None)
@given(MANIFEST)
def test_jsonschema_agrees_with_the_compiled_schema(data):
    """The reader's types and keys are the JSON Schema's (its path rules are the x-waypost-path extension)."""
    assert (STRUCTURE(data) is None) == VALIDATOR.is_valid(data)


def test_the_schema_is_a_json_schema_and_the_compiler_takes_nothing_it_does_not_check():
    jsonschema.Draft202012Validator.check_schema(manifest.schema())
    with pytest.raises(ValueError, match="unsupported keyword"):
        manifest.compile_schema({"type": "object", "properties": {"x": {"oneOf": [{"type": "string"}]}}})


# --- reuse from another team's local root -------------------------------------

def refused_run(mine: Path, config: dict, *args: str) -> str:
    write_config(mine, config)
    proc = snakemake(mine, "--until", "train_vocab", *args, check=False)
    assert proc.returncode != 0
    return proc.stdout + proc.stderr


def test_reuse_refuses_another_roots_manifest_whose_output_climbs_to_my_config(theirs, mine):
    """Their clean_corpus lists one more output, four levels up: from my
    stage dir that is my own config.yaml, which the copy would replace."""
    root = theirs / "results"
    stage = root / "en-xb/exp1/clean_corpus"
    plant(stage, "../../../../config.yaml", (theirs / "config.yaml").read_bytes())
    before = own_files(mine)
    message = f"{stage}: manifest lists output '../../../../config.yaml', {LEAVES}"

    proc = waypost(mine, "reuse", "--into", "exp2", "--from", "exp1", "--upstream-of", "train_vocab",
                   "--from-root", str(root), check=False)
    assert proc.returncode == 1 and message in proc.stderr, proc.stderr
    assert own_files(mine) == before   # no reuse file written either

    # The pointers written by hand: the run stops before any job, naming it.
    out = refused_run(mine, user_config(reuse=pointers(("fetch_corpus", "clean_corpus"), str(root))))
    assert "can't be used (nothing was run)" in out and message in out, out
    assert (mine / "config.yaml").read_bytes() != (theirs / "config.yaml").read_bytes()
    assert not (mine / "results").exists() or not list((mine / "results").rglob("*.tsv"))


def test_reuse_refuses_another_roots_manifest_with_an_absolute_output(theirs, mine):
    root = theirs / "results"
    stage = root / "en-xa/exp1/fetch_corpus"
    target = mine / "notes.md"
    plant(stage, str(target), target.read_bytes())   # they know what is in it: the checksums would match
    before = own_files(mine)

    proc = waypost(mine, "reuse", "--into", "exp2", "--from", "exp1", "--upstream-of", "clean_corpus",
                   "--from-root", str(root), check=False)
    assert proc.returncode == 1
    assert f"{stage}: manifest lists output '{target}', which is an absolute path, outside its stage directory" \
        in proc.stderr
    out = refused_run(mine, user_config(reuse=pointers(("fetch_corpus",), str(root))))
    assert "which is an absolute path" in out
    after = own_files(mine)
    assert after["notes.md"] == before["notes.md"] and not list(mine.glob(".tmp-reuse-*"))   # same inode too
    assert not [rel for rel in after if rel.startswith("results/") and not rel.startswith("results/_held")]


def test_reuse_never_follows_a_link_out_of_their_stage_and_follows_one_inside(theirs, mine):
    """Their train_vocab of en-xa is a link to a file beside their root (its
    manifest unchanged, so its checksums match); en-xb's is a link to a file
    inside the stage."""
    root = theirs / "results"
    out_of = root / "en-xa/exp1/train_vocab/vocab.json"
    shared = theirs / "shared-vocab.json"
    shutil.move(out_of, shared)
    out_of.symlink_to(shared)
    inside = root / "en-xb/exp1/train_vocab"
    (inside / "real").mkdir()
    shutil.move(inside / "vocab.json", inside / "real/vocab.json")
    (inside / "vocab.json").symlink_to("real/vocab.json")
    waypost(mine, "reuse", "--into", "exp2", "--from", "exp1", "--upstream-of", "train_backward",
            "--from-root", str(root))   # the manifests are fine: the pointers are written

    proc = snakemake(mine, "--until", "train_vocab", "--keep-going", check=False)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert f"{out_of}: a reused output is a symbolic link to {shared}, outside its stage directory; not reused" in out
    refused = mine / "results/en-xa/exp2/train_vocab"
    assert not (refused / "vocab.json").exists() and not (refused / "_manifest.json").exists()
    taken = mine / "results/en-xb/exp2/train_vocab"
    assert read_manifest(taken)["state"] == "SUCCESS"
    assert not (taken / "vocab.json").is_symlink()   # the file the link inside points to, copied
    assert (taken / "vocab.json").read_bytes() == (inside / "real/vocab.json").read_bytes()
    assert not os.path.samefile(taken / "vocab.json", inside / "real/vocab.json")


# --- reuse from another team's bucket -----------------------------------------

def plant_object(root: str, stage: str, rel: str, data: bytes) -> None:
    """An object at ``stage/rel`` (the name as it is, ``..`` and all) and one
    more output naming it in the stage's manifest."""
    fs().pipe_file(f"{key(root)}/{stage}/{rel}", data)
    path = f"{key(root)}/{stage}/_manifest.json"
    record = json.loads(fs().cat_file(path))
    record["outputs"].append({"path": rel, "size": len(data), "sha256": sha256(data)})
    fs().pipe_file(path, json.dumps(record).encode())


def test_reuse_refuses_a_bucket_manifest_whose_output_climbs_or_is_absolute(gcs_copy, tmp_path):
    """From a bucket into a local root (a download would climb to my
    working directory) and into a root in a bucket (a server-side copy
    would land outside my stage)."""
    root = gcs_copy.root
    plant_object(root, "en-xa/exp1/clean_corpus", "../../../../planted.smk", b"rule all: ...\n")
    mine = tmp_path / "mine"
    mine.mkdir()
    notes = mine / "notes.md"
    notes.write_text("my notes\n")
    plant_object(root, "en-xb/exp1/fetch_corpus", str(notes), notes.read_bytes())
    climbs = f"{root}/en-xa/exp1/clean_corpus: manifest lists output '../../../../planted.smk', {LEAVES}"
    absolute = f"{root}/en-xb/exp1/fetch_corpus: manifest lists output '{notes}', which is an absolute path"

    write_config(mine, user_config())
    proc = waypost(mine, "reuse", "--into", "exp2", "--from", "exp1", "--upstream-of", "train_vocab",
                   "--from-root", root, check=False)
    assert proc.returncode == 1 and climbs in proc.stderr and absolute in proc.stderr, proc.stderr
    assert not (mine / "reuse").exists()

    reuse = pointers(("fetch_corpus", "clean_corpus"), root)
    out = refused_run(mine, user_config(reuse=reuse))
    assert climbs in out and absolute in out
    assert not (mine / "planted.smk").exists() and notes.read_text() == "my notes\n"

    # A root in a bucket too: refused at planning, no object written.
    mine_root = root.rsplit("/", 1)[0] + "/mine"
    before = set(fs().find(key(root).split("/")[0]))
    out = refused_run(mine, user_config(root=mine_root, reuse=reuse), *flags(mine_root))
    assert climbs in out and absolute in out
    assert set(fs().find(key(root).split("/")[0])) == before


def test_bucket_objects_whose_names_climb_are_never_pulled_archived_adopted_or_read(gcs_copy, tmp_path, capfd):
    from waypost.stores.mirror import BucketWorkspace

    root, work = gcs_copy.root, gcs_copy.workdir
    stage = "en-xa/exp1/train_backward"
    odd = [f"{stage}/checkpoints/../../../../../../../../../../escaped.txt", f"{stage}/a//b.txt",
           f"{stage}/ok/../../../sneaky.txt", f"{stage}/back\\slash.txt"]
    for name in odd:
        fs().pipe_file(f"{key(root)}/{name}", b"planted\n")

    # The step runner's local copy of the stage: what a series going on in place pulls.
    mirror = tmp_path / "mirror"
    remote = BucketWorkspace(f"{root}/{stage}", str(mirror / key(root) / stage))
    remote.pull([])
    remote.pull_workspace()
    assert (mirror / key(root) / stage / "model.json").exists()   # what is fine came down
    assert not [p for p in tmp_path.rglob("*") if p.name in ("escaped.txt", "sneaky.txt", "b.txt", "back\\slash.txt")]
    err = capfd.readouterr().err
    assert "checkpoints/../../../../../../../../../../escaped.txt' leaves its stage directory; left alone" in err
    assert remote.archive() == ".attempts/1"
    names = set(fs().find(key(root)))
    assert {f"{key(root)}/{n}" for n in odd} <= names   # left where they were, not moved along
    assert f"{key(root)}/{stage}/.attempts/1/model.json" in names
    assert not [n for n in names if ".attempts/1/checkpoints/.." in n or ".attempts/1/ok" in n]

    # adopt lists only what a path can stand for.
    config = yaml.safe_load((work / "config.yaml").read_text())
    config["experiments"]["exp2"] = {"pairs": ["en-xa"], "teachers": 2}
    write_config(work, config)
    placed = "en-xa/exp2/train_vocab"
    fs().pipe_file(f"{key(root)}/{placed}/vocab.json", b"{}\n")
    fs().pipe_file(f"{key(root)}/{placed}/x/../../../../../../mine.json", b"{}\n")
    waypost(work, "adopt", "train_vocab", "--experiment", "exp2", "--pair", "en-xa")
    record = json.loads(fs().cat_file(f"{key(root)}/{placed}/_manifest.json"))
    assert [o["path"] for o in record["outputs"]] == ["vocab.json"]

    # A manifest whose own name climbs is never read by the catalog; the commands go on.
    fs().pipe_file(f"{key(root)}/en-xa/exp1/clean_corpus/x/../../../../../_manifest.json", b"{}")
    proc = waypost(work, "find", "--json", check=False)
    assert "an object name that leaves its stage directory; not read" in proc.stderr and "Traceback" not in proc.stderr
    assert any(r["stage"] == "train_vocab" for r in json.loads(proc.stdout))
    for command in (("status", "--json"), ("verify",)):
        proc = waypost(work, *command, check=False)
        assert "Traceback" not in proc.stderr, proc.stderr
    assert planned(work, *flags(root), "--until", "train_vocab") == {}   # the planning's listing leaves them out


# --- the commands that look, on a local root -----------------------------------

def test_verify_status_find_lineage_refuse_a_manifest_that_lists_a_file_outside(run_copy, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"s" * 4321)
    stage = run_copy / "results/en-xa/exp1/train_vocab"
    rel = os.path.relpath(secret, stage)
    plant(stage, rel, secret.read_bytes())
    said = f"manifest lists output {rel!r}, {LEAVES}"

    proc = waypost(run_copy, "verify", check=False)
    assert proc.returncode == 1 and f"results/en-xa/exp1/train_vocab: {said}; not done" in proc.stdout
    assert "4321" not in proc.stdout   # its size was never asked for
    cell = json.loads(waypost(run_copy, "status", "--json").stdout)["experiments"]["exp1"]["en-xa"]["train_vocab"]
    assert cell["state"] == "corrupt" and said in cell["error"]
    waypost(run_copy, "status", "--html", str(tmp_path / "status.html"))
    assert "which leaves its stage directory; not using this manifest" in (tmp_path / "status.html").read_text()

    proc = waypost(run_copy, "find", "--json", check=False)
    assert f"waypost: catalog: skipped {stage}: {said}" in proc.stderr, proc.stderr
    assert not [r for r in json.loads(proc.stdout) if r["location"] == str(stage)]
    consumer = run_copy / "results/en-xa/exp1/train_backward"
    tree = json.loads(waypost(run_copy, "find", "--no-refresh", "--lineage", str(consumer), "--json").stdout)
    assert [n.get("missing") for n in tree["inputs"] if n["location"] == str(stage)] == [True]
    waypost(run_copy, "find", "--html", str(tmp_path / "find.html"), check=False)

    proc = waypost(run_copy, "verify", "--repair", check=False)
    assert "archived in results/en-xa/exp1/train_vocab/.attempts/1" in proc.stdout
    assert secret.read_bytes() == b"s" * 4321 and (stage / ".attempts/1/_manifest.json").exists()


def test_verify_never_follows_an_output_that_is_a_link_out(run_copy, tmp_path):
    stage = run_copy / "results/en-xb/exp1/train_vocab"
    copy_of = tmp_path / "vocab-copy.json"
    shutil.move(stage / "vocab.json", copy_of)   # the same bytes: its size and checksum would match
    (stage / "vocab.json").symlink_to(copy_of)
    proc = waypost(run_copy, "verify", check=False)
    assert proc.returncode == 1
    assert f"vocab.json is a symbolic link out of its stage directory (to {copy_of})" in proc.stdout


def test_adopt_refuses_a_link_out_and_takes_the_file_a_link_inside_points_to(run_copy, tmp_path):
    config = yaml.safe_load((run_copy / "config.yaml").read_text())
    config["experiments"]["exp2"] = {"pairs": list(PAIRS), "teachers": 2}
    write_config(run_copy, config)
    target = run_copy / "results/en-xa/exp2/train_vocab"
    target.mkdir(parents=True)
    (target / "vocab.json").write_text("{}\n")
    (target / "extra").symlink_to(tmp_path)           # a directory outside
    proc = waypost(run_copy, "adopt", "train_vocab", "--experiment", "exp2", "--pair", "en-xa", check=False)
    assert proc.returncode == 1
    assert f"extra is a symbolic link to {tmp_path}, outside the stage directory or to nothing" in proc.stderr
    assert "nothing adopted" in proc.stderr and not (target / "_manifest.json").exists()
    (target / "extra").unlink()
    (target / "also.json").symlink_to("vocab.json")
    waypost(run_copy, "adopt", "train_vocab", "--experiment", "exp2", "--pair", "en-xa")
    outputs = {o["path"]: o["sha256"] for o in read_manifest(target)["outputs"]}
    assert outputs == {"also.json": sha256(b"{}\n"), "vocab.json": sha256(b"{}\n")}


def test_archiving_moves_links_as_links_and_never_through_one(run_copy, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "data.bin").write_bytes(b"keep me\n")
    stage = run_copy / "results/en-xa/exp1/train_vocab"
    (stage / "data").symlink_to(outside)
    waypost(run_copy, "rerun", "train_vocab", "--experiment", "exp1", "--pair", "en-xa")
    assert (stage / ".attempts/1/data").is_symlink() and (outside / "data.bin").read_bytes() == b"keep me\n"

    other = run_copy / "results/en-xb/exp1/train_vocab"
    (other / ".attempts").symlink_to(outside)   # archiving through it would move the workspace out
    proc = waypost(run_copy, "rerun", "train_vocab", "--experiment", "exp1", "--pair", "en-xb", check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"{other}/.attempts is a symbolic link (to {outside})" in proc.stderr
    assert sorted(p.name for p in outside.iterdir()) == ["data.bin"] and (other / "vocab.json").exists()


# --- every reader, fed random manifests ------------------------------------------

WRITES = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


class Audit:
    """Every path the code opens, stats, lists, writes, moves or removes
    while it is on (``with Audit() as seen``): (operation, absolute path,
    writes?)."""

    PATCHED: ClassVar = {"open": (os, True), "stat": (os, False), "link": (os, True), "rename": (os, True),
               "replace": (os, True), "unlink": (os, True), "remove": (os, True), "mkdir": (os, True),
               "rmdir": (os, True), "scandir": (os, False), "listdir": (os, False), "utime": (os, True),
               "symlink": (os, True), "truncate": (os, True), "chmod": (os, True)}

    def __init__(self):
        self.seen: list[tuple[str, str, bool]] = []
        self._stack = contextlib.ExitStack()

    def _note(self, name: str, args, kwargs, writes: bool) -> None:
        for i, arg in enumerate(args[:2] if name in ("link", "rename", "replace", "symlink") else args[:1]):
            if isinstance(arg, (str, bytes, os.PathLike)):
                path = os.path.abspath(os.fsdecode(arg))
                if name == "open" and i == 0:
                    mode = args[1] if len(args) > 1 else kwargs.get("flags", kwargs.get("mode", 0))
                    writes = (bool(mode & WRITES) if isinstance(mode, int) else any(c in mode for c in "wax+"))
                self.seen.append((name, path, writes))

    def __enter__(self):
        for name, (module, writes) in self.PATCHED.items():
            real = getattr(module, name)

            def wrapper(*args, _real=real, _name=name, _writes=writes, **kwargs):
                self._note(_name, args, kwargs, _writes)
                return _real(*args, **kwargs)
            self._stack.enter_context(mock.patch.object(module, name, wrapper))
        real_open = builtins.open

        def opener(file, mode="r", *args, **kwargs):
            if isinstance(file, (str, bytes, os.PathLike)):
                self.seen.append(("open", os.path.abspath(os.fsdecode(file)), any(c in mode for c in "wax+")))
            return real_open(file, mode, *args, **kwargs)
        self._stack.enter_context(mock.patch.object(builtins, "open", opener))
        return self

    def __exit__(self, *exc):
        self._stack.close()


# What a reader may answer with: a clear error (never a traceback).
CLEAR = (manifest.ManifestError,)


def every_reader(tmp: Path, text: bytes) -> list[tuple[str, object]]:
    """Each reader of a stage's manifest, run over a root whose one stage
    (p/e/s, with two archives of the same manifest) has ``text`` as its
    manifest: (reader, what it returned). Raises what a reader raised that
    is not a clear error."""
    from waypost.cli import findpage, statuspage
    from waypost.ops import adopt, catalog, plan, prune, steer
    from waypost.state import parents, reuse, status, verify
    from waypost.stores import mirror

    root, stage = tmp / "root", tmp / "root/p/e/s"
    config = {"root": str(root), "experiments": {"e": {"pairs": ["p"]}, "e2": {"pairs": ["p"]}},
              "stages": {"s": {}}, "retention": {"keep_last": 0, "keep_days": None}}
    results = []

    def run(name, call, *errors):
        try:
            results.append((name, call()))
        except CLEAR + errors as exc:
            assert "\n" not in str(exc).strip(), (name, str(exc))
            results.append((name, exc))

    run("parse", lambda: manifest.parse(text, str(stage / layout.MANIFEST)))
    run("read", lambda: manifest.read(str(stage)))
    run("load", lambda: stores.manifest_at(str(stage)))
    for snapshot in (False, True):
        tree = stores.store_for(str(root), snapshot=snapshot)
        run("tree", lambda tree=tree: tree.manifest(str(stage)))
    run("archived runs", lambda: status.archived_runs(stores.store_for(str(root)), str(stage)))
    grid = status.collect(config, funnels=[])
    results.append(("status", grid))
    results.append(("status page", statuspage.render(grid)))
    results.append(("verify", verify.verify(str(root), checksums=True, repair=False)))
    cat = catalog.Catalog(str(tmp / "work/catalog.sqlite"))
    results.append(("catalog", cat.refresh(str(root))))
    rows = cat.find()
    results.append(("lineage", cat.lineage(str(stage))))
    results.append(("find page", findpage.render(findpage.build(rows, root=str(root), experiments={"e": ["p"]}))))
    cat.close()
    results.append(("prune", prune.plan(config)))
    results.append(("consumers", steer._consumers(stores.store_for(str(root)), ["e", "e2"])))
    run("rerun", lambda: steer.rerun(config, "s", experiments=["e"], downstream=True, dry_run=True), steer.SteerError)
    run("retry", lambda: steer.retry(config, "s", experiments=["e"], dry_run=True), steer.SteerError)
    results.append(("drift", plan.drift(config, {"s": "sha256:000000000000"}, [])))
    results.append(("reuse check", reuse.source_problem(str(stage))))
    # The reuse job's arguments (as the runner's options, and as a step spec's fields).
    args = SimpleNamespace(stage_dir=str(tmp / "mine/p/e2/s"), local_dir=None, mirror=None, reuse_from=str(stage),
                           input=[], output=[], inputs=[], outputs=[], experiment="e2", pair="p", stage="s",
                           instance=None, own_layout=False, temporary=[], wildcards={})
    results.append(("reuse", reuse.take(args)))
    results.append(("blocking", mirror.blocking_manifests(text)))
    results.append(("inputs", parents.describe_inputs([str(stage / "out.txt")])))
    results.append(("repair", verify.verify(str(root), checksums=True, repair=True)))
    run("adopt", lambda: adopt.adopt(config, "s", "e", "p", force=True), steer.SteerError)
    return results


def lay_out(tmp: Path, text: bytes) -> None:
    """The root: one stage with its files, its manifest ``text`` and two
    archives of it; beside the root, OUTSIDE with a secret and a manifest."""
    for name in ("root", "mine", "work"):
        shutil.rmtree(tmp / name, ignore_errors=True)
    stage = tmp / "root/p/e/s"
    (stage / "sub").mkdir(parents=True)
    (stage / "out.txt").write_bytes(b"out")
    (stage / "sub/model.bin").write_bytes(b"model")
    for where in (stage, stage / ".attempts/1", stage / ".attempts/2"):
        where.mkdir(parents=True, exist_ok=True)
        (where / layout.MANIFEST).write_bytes(text)
    (tmp / "work").mkdir()
    outside = tmp / "outside"
    outside.mkdir(exist_ok=True)
    (outside / "secret.txt").write_bytes(b"secret")
    (outside / layout.MANIFEST).write_text(json.dumps(good_record()))


def stage_record() -> dict:
    """A valid manifest of the stage ``lay_out`` makes (its two files listed)."""
    return good_record(outputs=[{"path": "out.txt", "size": 3, "sha256": sha256(b"out")},
                                {"path": "sub/model.bin", "size": 5, "sha256": sha256(b"model")}])


ESCAPES = st.sampled_from(["../../../../outside/secret.txt", "{OUTSIDE}/secret.txt", "sub/../../../../../outside/secret.txt",
                           "../../../../outside", "sub/./../out.txt", "a\\..\\..\\x", "_manifest.json"])


@st.composite
def nearly_valid(draw) -> str:
    """A valid manifest of the stage with a few things changed: an output
    (sized and summed as the secret beside the root, so only the path rules
    stand between it and a reader) or an attempt's log that escapes, an
    input or reuse source that climbs, a field of another type, a key gone."""
    record = stage_record()
    kinds = ["output", "replace", "log", "workspace", "input", "reused", "type", "drop"]
    changes = draw(st.lists(st.sampled_from(kinds), min_size=1, max_size=3))
    for change in sorted(changes, key=kinds.index):   # paths first, then types and keys
        if change == "output":
            record["outputs"].append({"path": draw(ESCAPES), "size": 6, "sha256": sha256(b"secret")})
        elif change == "replace":
            record["outputs"][draw(st.integers(0, 1))].update(path=draw(ESCAPES), size=6, sha256=sha256(b"secret"))
        elif change in ("log", "workspace"):
            record["attempts"][0][change] = draw(ESCAPES)
        elif change == "input":
            record["inputs"].append({"path": "{OUTSIDE}/secret.txt", "manifest": draw(st.sampled_from(
                ["{OUTSIDE}/_manifest.json", "root/p/e/up/_manifest.json", None])), "state": "FAILED",
                "sha256": sha256(b"secret")})
        elif change == "reused":
            record["reused_from"] = draw(st.sampled_from(["{OUTSIDE}", "root/p/e/s/../../../../outside"]))
        elif change == "type":
            record[draw(st.sampled_from(sorted(record)))] = draw(JSON)
        elif record:
            record.pop(draw(st.sampled_from(sorted(record))))
    return json.dumps(record)


TEXTS = st.one_of(nearly_valid(), nearly_valid(), MANIFEST.map(json.dumps), MANIFEST.map(json.dumps).map(lambda t: t[: len(t) // 2]),
                  st.just(json.dumps(stage_record())), JSON.map(json.dumps)).map(str.encode) | st.binary(max_size=40)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(text=TEXTS)
def test_every_reader_gives_a_valid_record_or_a_clear_error_and_touches_nothing_outside(tmp_path, text):
    outside = tmp_path / "outside"
    text = text.replace(b"{OUTSIDE}", str(outside).encode())
    lay_out(tmp_path, text)
    before = files_below(outside)
    cwd = os.getcwd()
    os.chdir(tmp_path / "work")   # (verify keeps its checksum cache here)
    try:
        with contextlib.redirect_stderr(open(os.devnull, "w")), Audit() as audit:
            results = every_reader(tmp_path, text)
    finally:
        os.chdir(cwd)
    # Beside the root only a manifest is ever read (an input's producer: drift
    # and lineage read its _manifest.json, through the same reader); nothing
    # there is written. Every write is in the stage dirs or the work dir.
    touched = [(op, path) for op, path, writes in audit.seen if trust.inside(path, str(outside))
               and (writes or os.path.basename(path) != layout.MANIFEST)]
    assert touched == [], touched
    allowed = [str(tmp_path / name) for name in ("root", "mine", "work")]
    stray = [(op, path) for op, path, writes in audit.seen if writes and trust.inside(path, str(tmp_path))
             and not any(trust.inside(path, a) for a in allowed)]
    assert stray == [], stray
    stage = str(tmp_path / "root/p/e/s")
    data = dict(results)["parse"]
    if isinstance(data, dict):   # a valid record: every path it lists inside its stage dir
        for out in data.get("outputs", []):
            assert trust.relative_problem(out["path"]) is None
            assert trust.inside(os.path.normpath(os.path.join(stage, out["path"])), stage)
        assert all(trust.location_problem(i["path"]) is None for i in data.get("inputs", []))
    else:
        assert isinstance(data, manifest.ManifestError)
    assert files_below(outside) == before
    mine = tmp_path / "mine/p/e2/s"
    assert all(trust.inside(str(p.resolve()), str(mine)) for p in mine.rglob("*")) if mine.exists() else True


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(text=TEXTS)
def test_every_bucket_reader_gives_a_valid_record_or_a_clear_error_and_writes_nothing_outside(bucket, tmp_path,
                                                                                              text):
    """The same manifests in a bucket: the tree, the status, the catalog, verify
    (and repair), reuse's reader and the step runner's pull of an input's
    manifests; no object appears outside the stage, no local file outside the mirror."""
    from waypost.ops import catalog
    from waypost.state import reuse, status, verify
    from waypost.stores.mirror import BucketWorkspace

    root = f"{bucket}/root"
    stage = f"{root}/p/e/s"
    text = text.replace(b"{OUTSIDE}", f"{bucket}/outside".encode())
    names = [f"{key(stage)}/{n}" for n in ("out.txt", "sub/model.bin", "_manifest.json", ".attempts/1/_manifest.json")]
    fs().pipe({names[0]: b"out", names[1]: b"model", names[2]: text, names[3]: text,
               f"{key(bucket)}/outside/secret.txt": b"secret"})
    stores.reset()
    before = set(fs().find(key(bucket)))
    work = tmp_path / "work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    results = []
    for name, call in [
        ("tree", lambda: stores.store_for(root).manifest(stage)),
        ("load", lambda: stores.manifest_at(stage)),
        ("reuse", lambda: reuse.read_source(stage)),
        ("cell", lambda: status.stage_cell(root, "e", "p", "s")),
        ("archived", lambda: status.archived_runs(stores.store_for(root), stage)),
        ("catalog", lambda: catalog.Catalog(str(work / "c.sqlite")).refresh(root)),
        ("verify", lambda: verify.verify(root, repair=False)),
        ("pull", lambda: BucketWorkspace(f"{root}/p/e/t", str(work / "mirror" / key(root) / "p/e/t")).pull(
            [str(work / "mirror" / key(stage) / "out.txt")])),
        ("repair", lambda: verify.verify(root, repair=True)),
    ]:
        try:
            results.append((name, call()))
        except manifest.ManifestError as exc:
            assert "\n" not in str(exc), (name, exc)
            results.append((name, exc))
    after = set(fs().find(key(bucket)))
    assert {n for n in after - before if not n.startswith(key(stage) + "/")} == set()
    assert {n for n in before - after if not n.startswith(key(stage) + "/")} == set()
    assert all(trust.inside(str(p.resolve()), str(work)) for p in work.rglob("*"))
    data = dict(results)["load"]
    assert isinstance(data, (dict, manifest.ManifestError))
    if isinstance(data, dict):
        assert all(trust.relative_problem(o["path"]) is None for o in data.get("outputs", []))
    fs().rm(key(bucket) + "/root", recursive=True)


def test_prune_never_walks_slims_or_removes_through_a_link_among_the_archives(run_copy, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "big.bin").write_bytes(b"x" * 1000)
    config = yaml.safe_load((run_copy / "config.yaml").read_text())
    config["retention"] = {"keep_last": 0}
    write_config(run_copy, config)
    waypost(run_copy, "rerun", "train_vocab", "--experiment", "exp1", "--pair", "en-xa")   # a real archive: 1
    stage = run_copy / "results/en-xa/exp1/train_vocab"
    (stage / ".attempts/7").symlink_to(outside)   # not an archive: a link
    other = run_copy / "results/en-xb/exp1/train_vocab"
    (other / ".attempts").symlink_to(outside)
    sizes = json.loads(waypost(run_copy, "status", "--sizes", "--json").stdout)
    assert [(r["pair"], r["archives"]) for r in sizes["stages"] if r["stage"] == "train_vocab"] == [("en-xa", 1)]
    out = waypost(run_copy, "prune").stdout
    assert "train_vocab/.attempts/1" in out and ".attempts/7" not in out
    assert (outside / "big.bin").read_bytes() == b"x" * 1000 and (stage / ".attempts/7").is_symlink()
