"""The stage manifest: what a stage directory holds, how it came to be, and
whether it is done.

``_manifest.json`` is written last and atomically (temp file + rename in the
same directory), so a reader sees either the previous manifest or the new one,
never half of one; a step killed mid-way leaves no new manifest.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import time
from collections.abc import Mapping
from typing import Any, cast

from waypost.model import locations, records, trust, writes
from waypost.model.errors import WaypostError
from waypost.model.job import Job
from waypost.model.layout import ATTEMPTS, ENGINE_FILES, MANIFEST, is_in_progress
from waypost.model.records import Manifest

HASH_CHUNK = 1 << 20


# The run a job belongs to: set by Snakemake's main process (waypost.snakemake),
# inherited by every job of the run; each attempt records it.
RUN_ID_ENV = "WAYPOST_RUN_ID"


def new_run_id() -> str:
    """A new run's id: when and where it started, e.g. 20261130T002512-vm-48213."""
    return f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{hostname()}-{os.getpid()}"


class ManifestError(WaypostError, ValueError):
    """A manifest that cannot be read or does not have the expected shape."""


# How every message of a manifest waypost won't use ends.
UNUSED = "not using this manifest"


def now_iso() -> str:
    """UTC now as ISO 8601 with milliseconds, e.g. 2026-11-29T21:05:55.123+00:00
    (``time`` rather than ``datetime``: the runner starts at every step)."""
    return epoch_to_iso(time.time())


def epoch_to_iso(epoch: float) -> str:
    """An epoch time as ``now_iso`` writes times."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(epoch)) + f".{int(epoch * 1000) % 1000:03d}+00:00"


def iso_to_epoch(text: str) -> float:
    """The epoch time of a UTC time as waypost writes them (``now_iso``)."""
    import calendar
    whole, _, rest = text.partition(".")
    return calendar.timegm(time.strptime(whole[:19], "%Y-%m-%dT%H:%M:%S")) + float("0." + (rest[:3] or "0"))


def sha256_file(path: str) -> str:
    with open(path, "rb") as f:
        return sha256_stream(f)


def sha256_stream(f) -> str:
    """The sha256 of what is left to read in a binary file object."""
    digest = hashlib.sha256()
    while chunk := f.read(HASH_CHUNK):
        digest.update(chunk)
    return digest.hexdigest()


def crc32c_extend():
    """google_crc32c's ``extend``, imported when first needed (the runner
    starts at every step, and only a success describes outputs); None when
    it can't be imported (the manifest then records no crc32c). A runner
    started without ``site`` (``launch``) looks for it in the site-packages
    of its interpreter's environment, after the standard library and waypost."""
    try:
        import google_crc32c
    except ImportError:
        lib = os.path.join(sys.platlibdir, f"python{sys.version_info[0]}.{sys.version_info[1]}", "site-packages")
        for prefix in (os.path.dirname(os.path.dirname(os.path.abspath(sys.executable))), sys.prefix):
            path = os.path.join(prefix, lib)
            if path not in sys.path and os.path.isdir(path):
                sys.path.append(path)
        try:
            import google_crc32c
        except ImportError:
            print("waypost: google-crc32c can't be imported: the manifest records no crc32c", file=sys.stderr)
            return None
    return google_crc32c.extend


def crc32c_text(crc: int) -> str:
    """A CRC32C as GCS lists it: base64 of its 4 big-endian bytes."""
    import binascii  # (base64 is binascii with more imports)
    return binascii.b2a_base64(crc.to_bytes(4, "big"), newline=False).decode()


def digests_stream(f) -> tuple[str, str | None]:
    """(sha256 hex, crc32c as GCS lists it) of what is left to read in a
    binary file object, in one read pass (crc32c None: see ``_crc32c``)."""
    extend = crc32c_extend()
    digest, crc = hashlib.sha256(), 0
    while chunk := f.read(HASH_CHUNK):
        digest.update(chunk)
        if extend:
            crc = extend(crc, chunk)
    return digest.hexdigest(), extend and crc32c_text(crc)


def digests_file(path: str) -> tuple[str, str | None]:
    with open(path, "rb") as f:
        return digests_stream(f)


def dumps(data: dict) -> str:
    """How waypost writes a manifest (or marker) file."""
    return json.dumps(data, indent=2, sort_keys=False) + "\n"


def describe_outputs(stage_dir: str, paths: list[str], temporary: list[str] = (),
                     side: list[str] = ()) -> list[dict]:
    """Size, sha256 and crc32c (GCS's checksum, as it lists it: what
    ``waypost verify`` compares on a gs:// root without downloading) of each
    output, with paths relative to the stage dir; both checksums from one
    read. ``temporary``: the ones Snakemake removes later (``temp()``), so
    marked; ``side``: files a job left beside its declared outputs, so marked."""
    described = []
    temp, beside = set(temporary), set(side)
    for path in files_of(paths):
        sha256, crc32c = digests_file(path)
        described.append({
            "path": os.path.relpath(path, stage_dir),
            "size": os.path.getsize(path),
            "sha256": sha256,
            **({"crc32c": crc32c} if crc32c else {}),
            **({"temp": True} if path in temp else {}),
            **({"side": True} if path in beside else {}),
        })
    return described


def files_beside(directories, declared: set[str]) -> list[str]:
    """The files in ``directories`` (not below; absolute paths, sorted) that
    are not among ``declared`` (absolute paths) nor one of waypost's own
    being written or fetched (``layout.is_in_progress``): what a job left
    beside its outputs."""
    found = []
    for directory in directories:
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            path = os.path.abspath(entry.path)
            if entry.is_file(follow_symlinks=False) and path not in declared and not is_in_progress(entry.name):
                found.append(path)
    return sorted(found)


def files_of(paths: list[str]) -> list[str]:
    """The outputs as files: a ``directory()`` output's files, sorted, or
    the files of the directory a link given as an output points to (as
    Snakemake takes it). Below it, a link to a file is that file under the
    link's name; a link to a directory, or one to nothing, holds no file."""
    files = []
    for path in paths:
        if os.path.isdir(path):
            files += sorted(full for top, _, names in os.walk(path) for full in (os.path.join(top, n) for n in names)
                            if os.path.exists(full))
        else:
            files.append(path)
    return files


def hostname() -> str:
    """This machine's name (``socket.gethostname()``, without importing socket)."""
    return os.uname().nodename


def write_json_atomic(path: str, data: Mapping[str, Any], durable: bool = True) -> None:
    """Temp file + rename (``writes.whole``): readers see the old file or
    the new one. With ``durable``, the data is on disk (fsync) before the rename."""
    writes.whole(path, dumps(data).encode(), durable=durable)


def manifest_path(stage_dir: str) -> str:
    return os.path.join(stage_dir, MANIFEST)


def read(stage_dir: str) -> Manifest | None:
    """The manifest of a local stage directory; None when there is none.

    Raises ManifestError when the file exists but is not a usable manifest
    (see ``parse``), or is a symbolic link, not a regular file, or over
    ``trust.MAX_MANIFEST_BYTES``.
    """
    path = manifest_path(stage_dir)
    try:
        text, _ = trust.read_regular(path)
    except FileNotFoundError:
        return None
    except trust.Untrusted as exc:
        raise ManifestError(f"{exc}; {UNUSED}") from None
    except OSError as exc:
        raise ManifestError(f"{path}: unreadable manifest ({exc})") from exc
    return parse(text, path)


def parse(text: bytes | str, path: str, bulk: bool = False) -> Manifest:
    """The one way waypost turns a manifest's bytes into a record: the
    manifest at ``path`` (its file or URL, for the messages) checked against
    the manifest schema (``schemas/manifest.schema.json``: the types and keys
    of the fields waypost uses; fields it doesn't know are kept as they are)
    and the path rules of ``trust`` (every path it records inside its stage
    directory). Returns the manifest as a dict; raises ManifestError with one
    line naming the manifest (or its stage directory) and what is wrong:
    bytes over ``trust.MAX_MANIFEST_BYTES``, not JSON (NaN and Infinity
    included), nested deeper than ``trust.MAX_DEPTH``, a wrong type, a
    missing key, an absurd size or a path that leaves the stage directory.
    Never anything else (no traceback for any input). ``bulk``: one of
    many (a catalog's cold build), decoded by msgspec (``_bulk_loads``)."""
    if len(text) > trust.MAX_MANIFEST_BYTES:
        raise ManifestError(f"{trust.too_big(path, len(text))}; {UNUSED}")
    try:
        data = _bulk_loads(text) if bulk else json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise ManifestError(f"{path}: unreadable manifest (nested too deeply); {UNUSED}") from None
    except ValueError as exc:   # not JSON, not UTF-8, a number of thousands of digits, NaN
        raise ManifestError(f"{path}: unreadable manifest ({_shown(str(exc))[1:-1]}); {UNUSED}") from None
    if type(data) is not dict:
        raise ManifestError(f"{path}: not a waypost manifest ({_kind(data)}, not an object); {UNUSED}")
    fail = _validator()(data)
    if fail is not None:
        where = path[:-len(MANIFEST) - 1] if path.endswith("/" + MANIFEST) else path
        raise ManifestError(f"{where}: {fail.message()}; {UNUSED}")
    return cast(Manifest, records.upgrade(data))   # (the schema checked the types of the keys it has)


_bulk_decode = None


def _bulk_loads(text: bytes | str):
    """``json.loads``'s value, ~2x as fast, by msgspec (imported on first
    use: ~10 ms, worth it for thousands of manifests, not for a step's few).
    msgspec refuses all that json does (NaN and Infinity included) and more
    (a BOM, UTF-16, 1e400, a lone surrogate, deep nesting; it keeps big
    integers as json does: tests/test_integrity.py compares them); whatever
    it refuses goes to json, so what is accepted, and the message for what
    isn't, stay json's."""
    global _bulk_decode
    if _bulk_decode is None:
        import msgspec
        _bulk_decode = msgspec.json.Decoder().decode
    try:
        return _bulk_decode(text)
    except (ValueError, RecursionError):   # (msgspec.DecodeError is a ValueError)
        return json.loads(text, parse_constant=_no_constant)


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _shallow(data, limit: int) -> bool:
    """Are lists and objects nested at most ``limit`` deep in ``data``?"""
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > limit:
            return False
        for child in (value.values() if type(value) is dict else value):
            if type(child) is dict or type(child) is list:
                stack.append((child, depth + 1))
    return True


# --- the schema, compiled ----------------------------------------------------
# The manifest schema is a JSON Schema (draft 2020-12; tests check that
# jsonschema agrees with this reader), compiled here into plain functions:
# jsonschema itself takes ~30x longer per manifest, and the step runner reads
# a manifest per input at every step. The subset below is all it uses; any
# other keyword fails the compilation, so the schema can't say more than is
# checked. ``x-waypost-path`` names a path rule of ``trust`` (PATH_RULES).

SCHEMA_FILE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "schemas", "manifest.schema.json")
_IGNORED = {"$schema", "$id", "$defs", "title", "description", "$comment", "default", "examples"}
_KINDS = {dict: "an object", list: "a list", str: "a string", int: "an integer", float: "a number",
          bool: "a boolean", type(None): "null"}
_TYPE_WORDS = {"object": "an object", "array": "a list", "string": "a string", "integer": "an integer",
               "number": "a number", "boolean": "a boolean", "null": "null"}


def _kind(value) -> str:
    return _KINDS.get(type(value), type(value).__name__)


class _Fail:
    """Why a value does not fit (``what``), and where in the manifest (``at``, innermost first)."""

    __slots__ = ("at", "path", "what")

    def __init__(self, what: str, path: bool = False):
        self.what, self.path, self.at = what, path, []

    def message(self) -> str:
        if self.path:
            return f"manifest {self.what}"
        where = ""
        for key in reversed(self.at):
            if type(key) is int:
                where += f"[{key}]"
            elif key.isidentifier() and len(key) <= 64:
                where += f".{key}" if where else key
            else:   # a key waypost doesn't know may hold anything: quoted
                where += f"[{_shown(key)}]"
        return f"manifest field {where} {self.what}" if where else f"manifest {self.what}"


def _shown(value: str) -> str:
    return repr(value if len(value) <= 200 else value[:200] + "...")


def _relative_rule(label: str, dot: bool = False, engine: bool = False):
    def check(value):
        problem = trust.relative_problem(value, dot=dot)
        if problem is None and engine:
            first = value.split("/", 1)[0]
            if first in ENGINE_FILES or first.startswith(".tmp-"):
                problem = f"is waypost's own {first!r}"
        return None if problem is None else _Fail(f"lists {label} {_shown(value)}, which {problem}", path=True)
    return check


def _location_rule(label: str, manifest_file: bool = False):
    def check(value):
        problem = trust.location_problem(value)
        if problem is None and manifest_file and value.rsplit("/", 1)[-1] != MANIFEST:
            problem = f"is not a {MANIFEST}"
        return None if problem is None else _Fail(f"lists {label} {_shown(value)}, which {problem}", path=True)
    return check


def _input_rule(value):
    """An input lies in the stage directory of the manifest it names (its
    producer a job of a rule in its own layout: in that job's
    ``outputs_dir``, from there)."""
    record, path = value.get("manifest"), value.get("path")
    if type(record) is not str or type(path) is not str:
        return None
    directory = record[:-len(MANIFEST)].rstrip("/")
    if type(value.get("outputs_dir")) is str and directory:
        directory = locations.resolve(directory, value["outputs_dir"])
    rest = path[len(directory) + 1:] if path.startswith(directory + "/") and directory else None
    if rest is None or trust.relative_problem(rest) is not None:
        return _Fail(f"lists input {_shown(path)}, which is not in the stage directory of its manifest "
                     f"{_shown(record)}", path=True)
    return None


PATH_RULES = {
    "output": _relative_rule("output", engine=True),
    "directory member": _relative_rule("directory member"),
    "workspace": _relative_rule("an attempt's workspace", dot=True),
    "log": _relative_rule("an attempt's log"),
    "reuse source": _location_rule("reuse source"),
    "outputs dir": _location_rule("outputs dir"),
    "input location": _location_rule("input"),
    "input's manifest": _location_rule("input manifest", manifest_file=True),
    "input": _input_rule,
}


_KEYWORDS = {"type", "enum", "properties", "required", "items", "minimum", "maximum", "maxLength", "maxItems",
             "pattern", "$ref", "additionalProperties", "x-waypost-path"}
_PY_TYPES = {"object": (dict,), "array": (list,), "string": (str,), "integer": (int,), "number": (int, float),
             "boolean": (bool,), "null": (type(None),)}


def _names(spec: dict) -> list[str]:
    kind = spec.get("type")
    return [kind] if isinstance(kind, str) else list(kind or ())


def _simple(spec: dict) -> bool:
    """Is a schema node a type and nothing more (no integers or numbers: 1.0 and inf need a look)?"""
    names = _names(spec)
    return bool(names) and not set(spec) - _IGNORED - {"type"} and not {"integer", "number"} & set(names)


def compile_schema(schema: dict, paths: bool = True):
    """A function of a parsed JSON value: None when it fits ``schema``,
    else a _Fail (``paths``: with the ``x-waypost-path`` rules). Lists and
    objects the schema says nothing of inside (a stage's settings, fields
    waypost doesn't know) are checked for nesting: at most
    ``trust.MAX_DEPTH`` levels."""
    defs: dict = {}
    deep = trust.MAX_DEPTH

    def ref(name: str):
        if name not in defs:
            defs[name] = None   # while it compiles: a definition that refers to itself looks it up when called
            defs[name] = node(schema["$defs"][name])
        return defs[name] or (lambda v: defs[name](v))

    def node(spec: dict):
        unknown = set(spec) - _IGNORED - _KEYWORDS
        if unknown or spec.get("additionalProperties", True) is not True:
            raise ValueError(f"manifest schema: unsupported keyword(s) {sorted(unknown) or ['additionalProperties']}")
        if "$ref" in spec:
            return ref(spec["$ref"].removeprefix("#/$defs/"))
        names = _names(spec)
        types = frozenset(t for n in names for t in _PY_TYPES[n]) if names else None
        integral = "integer" in names and "number" not in names   # floats only where integral (1.0)
        if integral:
            types = types | {float}
        expected = " or ".join(_TYPE_WORDS[n] for n in names)
        enum = list(spec["enum"]) if "enum" in spec else None
        low, high = spec.get("minimum"), spec.get("maximum")
        longest, pattern = spec.get("maxLength"), spec.get("pattern")
        search = re.compile(pattern).search if pattern else None
        most = spec.get("maxItems")
        # a field that only has a type (and no integers) is checked in place, without a call
        props = {name: (frozenset(t for n in _names(sub) for t in _PY_TYPES[n]), " or ".join(map(_TYPE_WORDS.get, _names(sub))))
                 if _simple(sub) else node(sub) for name, sub in (spec.get("properties") or {}).items()}
        required = tuple(spec.get("required") or ())
        item = node(spec["items"]) if "items" in spec else None
        rule = PATH_RULES[spec["x-waypost-path"]] if paths and "x-waypost-path" in spec else None

        def check(v):
            t = type(v)
            if types is not None and t not in types:
                return _Fail(f"is {_kind(v)}, expected {expected}")
            if enum is not None and not any(t is type(a) and v == a for a in enum):
                return _Fail(f"is {_shown(v) if t is str else _kind(v)}, expected one of {', '.join(map(str, enum))}")
            if t is str:
                if longest is not None and len(v) > longest:
                    return _Fail(f"is {len(v)} characters long, expected at most {longest}")
                if search is not None and not search(v):
                    return _Fail(f"is {_shown(v)}, which does not match {pattern}")
            elif t is dict:
                for name in required:
                    if name not in v:
                        return _Fail(f"has no {name!r}")
                for name, value in v.items():
                    sub = props.get(name)
                    if type(sub) is tuple:
                        if type(value) not in sub[0]:
                            fail = _Fail(f"is {_kind(value)}, expected {sub[1]}")
                            fail.at.append(name)
                            return fail
                        if (type(value) is dict or type(value) is list) and not _shallow(value, deep):
                            fail = _Fail(f"is nested deeper than {deep} levels")
                            fail.at.append(name)
                            return fail
                    elif sub is not None:
                        fail = sub(value)
                        if fail is not None:
                            fail.at.append(name)
                            return fail
                    elif (type(value) is dict or type(value) is list) and not _shallow(value, deep):
                        fail = _Fail(f"is nested deeper than {deep} levels")
                        fail.at.append(name)
                        return fail
            elif t is list:
                if most is not None and len(v) > most:
                    return _Fail(f"has {len(v)} items, expected at most {most}")
                if item is not None:
                    for i, x in enumerate(v):
                        fail = item(x)
                        if fail is not None:
                            fail.at.append(i)
                            return fail
                elif not _shallow(v, deep):
                    return _Fail(f"is nested deeper than {deep} levels")
            elif t is float or t is int:
                if t is float and (v != v or v in (float("inf"), float("-inf")) or (integral and not v.is_integer())):
                    return _Fail(f"is {_kind(v) if v == v and abs(v) != float('inf') else 'not a finite number'}, "
                                 f"expected {expected}")
                if (low is not None and v < low) or (high is not None and v > high):
                    bounds = (f"{low} to {high}" if low is not None and high is not None
                              else f"at least {low}" if low is not None else f"at most {high}")
                    return _Fail(f"is {v if abs(v) < 1e18 else 'absurdly large'}, expected {bounds}")
            if rule is not None and v is not None:
                return rule(v)
            return None
        return check

    return node(schema)


_compiled = None


def schema() -> dict:
    """The manifest schema (``schemas/manifest.schema.json``)."""
    with open(SCHEMA_FILE, "rb") as f:
        return json.loads(f.read())


def _validator():
    global _compiled
    if _compiled is None:
        _compiled = compile_schema(schema())
    return _compiled


def verify_outputs(stage_dir: str, data: Manifest, checksums: bool = True) -> list[str]:
    """Problems with the outputs a manifest lists (missing, size or checksum)."""
    problems = []
    base = Job.of_record(stage_dir, data).base
    for out in data.get("outputs", []):
        path = os.path.join(base, out["path"])
        if (out.get("temp") or out.get("side")) and not os.path.lexists(path):
            continue   # (removed by Snakemake once its consumers ran; a side file is not what makes it done)
        if not os.path.exists(path):
            problems.append(f"{out['path']}: missing")
        elif os.path.getsize(path) != out.get("size"):
            problems.append(f"{out['path']}: size {os.path.getsize(path)} != {out.get('size')}")
        elif checksums and sha256_file(path) != out.get("sha256"):
            problems.append(f"{out['path']}: checksum differs")
    return problems


def workspace_entries(stage_dir: str) -> list[str]:
    """What attempts left in the stage dir (everything but the archive)."""
    try:
        return sorted(e for e in os.listdir(stage_dir) if e != ATTEMPTS)
    except FileNotFoundError:
        return []


def is_engine_file(name: str) -> bool:
    return name in ENGINE_FILES or name.startswith(".tmp-")


# The set of inputs a stage was made from, as one short value: its manifest's
# object carries it as metadata in a bucket, so a planning compares a funnel's
# set with the one it would read now from the root's one listing.
INPUT_SET_KEY = "waypost-inputs"


def input_set(paths) -> str:
    """``N:digest`` of a set of input paths (order and repeats don't count)."""
    import hashlib
    unique = sorted(set(paths))
    return f"{len(unique)}:{hashlib.sha256(chr(10).join(unique).encode()).hexdigest()[:16]}"

