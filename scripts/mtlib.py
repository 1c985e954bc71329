"""Shared helpers for the waypost machine-translation step programs.

The scripts in this directory import this module as ``import mtlib`` (Python
puts a script's own directory on ``sys.path``).  Everything here uses only the
standard library.

Contents
--------
* errors and ``run_main``      -- clean "error: ..." exits for bad input
* tokenization                 -- lowercase + whitespace split
* file I/O                     -- TSV (``src<TAB>trg``) and plain text readers,
                                  atomic writers (temp file + ``os.replace``)
* IBM Model 1                  -- EM training with a NULL token, pruning,
                                  word-by-word (ensemble) decoding
* model files                  -- checkpoint / model JSON save and load
"""

import hashlib
import json
import math
import os
import random
import sys
import tempfile

# Name of the empty source word that IBM Model 1 lets target words align to.
NULL = "<null>"

# Translation-table entries kept per source word after every EM epoch.  The
# table in memory is pruned exactly like the checkpoint on disk, so a run that
# resumes from a checkpoint gives bit-identical results to one that did not stop.
TOP_K = 10

MODEL_FORMAT = "waypost-ibm1"
VOCAB_FORMAT = "waypost-vocab"
FORMAT_VERSION = 1

DIRECTIONS = ("src-trg", "trg-src")


# --------------------------------------------------------------------------
# Errors and program entry
# --------------------------------------------------------------------------

class MTError(Exception):
    """Bad input or state that the user has to fix; reported without a traceback."""


def run_main(main):
    """Run ``main()`` and turn expected failures into a one-line message + exit 1."""
    prog = os.path.basename(sys.argv[0])
    try:
        main()
    except MTError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        sys.exit(1)
    except OSError as exc:
        # Missing files, permission problems, full disks ...
        print(f"{prog}: error: {exc}", file=sys.stderr)
        sys.exit(1)


def log(message):
    """Print one line of the human-readable summary to stderr."""
    print(message, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------
# Tokenization
# --------------------------------------------------------------------------

def tokenize(text):
    """Lowercase and split on whitespace."""
    return text.lower().split()


def direction_sides(direction):
    """Return (input side, output side) of a direction, e.g. ('trg', 'src')."""
    if direction not in DIRECTIONS:
        raise MTError(f"unknown direction {direction!r}; expected one of {', '.join(DIRECTIONS)}")
    source, target = direction.split("-")
    return source, target


# --------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------

def read_lines(path):
    """Return the lines of a UTF-8 text file without their line endings."""
    try:
        with open(path, encoding="utf-8", newline="") as handle:
            text = handle.read()
    except FileNotFoundError:
        raise MTError(f"input file not found: {path}") from None
    except UnicodeDecodeError as exc:
        raise MTError(f"{path} is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the file ended with a newline
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def split_pair(line):
    """Split a TSV line into (src, trg); return None if it has no single tab."""
    parts = line.split("\t")
    if len(parts) != 2:
        return None
    return parts[0], parts[1]


def read_tsv(path):
    """Read a clean parallel corpus: a list of (src, trg) strings.

    Every line must be ``src<TAB>trg`` with both sides non-empty; cleaning
    (clean_corpus.py) is where messy lines are dealt with, so here they are an
    error that names the offending line.
    """
    pairs = []
    for number, line in enumerate(read_lines(path), start=1):
        pair = split_pair(line)
        if pair is None:
            raise MTError(f"{path}:{number}: expected 'source<TAB>target', got {line[:60]!r}")
        if not pair[0].strip() or not pair[1].strip():
            raise MTError(f"{path}:{number}: empty side in parallel line (run clean_corpus.py first?)")
        pairs.append(pair)
    return pairs


def read_text(path):
    """Read a monolingual file: the non-blank lines, plus how many blank ones were skipped."""
    lines = read_lines(path)
    kept = [line for line in lines if line.strip()]
    return kept, len(lines) - len(kept)


def file_sha256(path):
    """Hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# --------------------------------------------------------------------------
# Atomic writing
# --------------------------------------------------------------------------

def atomic_write_bytes(path, data):
    """Write ``data`` to ``path`` atomically.

    The bytes go to a temporary file in the same directory, which is flushed,
    fsynced and then renamed over ``path`` with ``os.replace``; readers see
    either the old file or the complete new one, never a partial write.
    Missing parent directories are created.
    """
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    handle = tempfile.NamedTemporaryFile(  # noqa: SIM115 (closed by the with below; kept to rename or remove)
        mode="wb", dir=directory, prefix="." + os.path.basename(path) + ".", suffix=".tmp", delete=False
    )
    try:
        with handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(handle.name, 0o644)  # NamedTemporaryFile creates files as 0600
        os.replace(handle.name, path)
    except BaseException:
        try:
            os.unlink(handle.name)
        except OSError:
            pass
        raise


def atomic_write_text(path, text):
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_lines(path, lines):
    """Write lines (without endings) as a newline-terminated UTF-8 file."""
    atomic_write_text(path, "".join(line + "\n" for line in lines))


def atomic_write_tsv(path, pairs):
    """Write (src, trg) pairs as ``src<TAB>trg`` lines."""
    lines = []
    for src, trg in pairs:
        if "\t" in src or "\t" in trg or "\n" in src or "\n" in trg:
            raise MTError(f"cannot write a tab or newline inside a TSV field: {src[:40]!r}")
        lines.append(f"{src}\t{trg}")
    atomic_write_lines(path, lines)


def atomic_write_json(path, obj):
    """Write ``obj`` as pretty, key-order-preserving JSON."""
    atomic_write_text(path, json.dumps(obj, ensure_ascii=False, indent=1) + "\n")


def read_json(path, what="JSON file"):
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except FileNotFoundError:
        raise MTError(f"{what} not found: {path}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise MTError(f"{what} {path} is not valid JSON: {exc}") from None


# --------------------------------------------------------------------------
# Vocabulary
# --------------------------------------------------------------------------

def load_vocab(path):
    """Load vocab.json as written by train_vocab.py."""
    vocab = read_json(path, "vocabulary")
    if not isinstance(vocab, dict) or vocab.get("format") != VOCAB_FORMAT:
        raise MTError(f"{path} is not a {VOCAB_FORMAT} file")
    for side in ("src", "trg"):
        if not isinstance(vocab.get(side), dict):
            raise MTError(f"{path} has no '{side}' vocabulary")
    return vocab


# --------------------------------------------------------------------------
# IBM Model 1
# --------------------------------------------------------------------------
#
# The model is a translation table t(f | e): the probability that input word e
# (or NULL) produces output word f.  It is stored as a dict of dicts,
# ``table[e][f] = probability``, each inner dict sorted from most to least
# probable.  "Input"/"output" follow the model's direction: a trg-src model
# reads target-language words and produces source-language words.

def init_table(pairs, rng, spread=0.1):
    """Uniform-ish starting table over co-occurring word pairs.

    Every (e, f) that co-occurs in some sentence pair (e including NULL) gets
    weight ``1 + spread * u`` with ``u`` drawn from ``rng`` in corpus order, so
    different seeds start EM from slightly different points.
    """
    weights = {}
    for inputs, outputs in pairs:
        for e in [NULL] + inputs:
            row = weights.setdefault(e, {})
            for f in outputs:
                if f not in row:
                    row[f] = 1.0 + spread * rng.random()
    table = {}
    for e, row in weights.items():
        total = sum(row.values())
        table[e] = {f: w / total for f, w in row.items()}
    return table


def prune_row(row, top_k=TOP_K):
    """Keep the ``top_k`` most probable entries (ties by word) and renormalise."""
    best = sorted(row.items(), key=lambda item: (-item[1], item[0]))[:top_k]
    total = sum(p for _, p in best)
    return {f: p / total for f, p in best}


def em_epoch(pairs, table, top_k=TOP_K):
    """One EM iteration of IBM Model 1.

    E-step: every output word f of a sentence pair distributes one unit of
    count over the input words (and NULL) in proportion to t(f | e).
    M-step: renormalise the counts per input word, then prune to ``top_k``.
    Returns (new table, log-likelihood, number of output tokens scored).
    """
    counts = {}
    log_likelihood = 0.0
    scored = 0
    for inputs, outputs in pairs:
        words = [NULL] + inputs
        rows = [table.get(e, {}) for e in words]
        count_rows = [counts.setdefault(e, {}) for e in words]
        for f in outputs:
            probs = [row.get(f, 0.0) for row in rows]
            z = sum(probs)
            if z <= 0.0:
                continue  # f was pruned away for every candidate word: no evidence
            for p, count_row in zip(probs, count_rows):
                if p > 0.0:
                    count_row[f] = count_row.get(f, 0.0) + p / z
            log_likelihood += math.log(z / len(words))
            scored += 1
    new_table = {}
    for e, row in counts.items():
        if row:
            total = sum(row.values())
            new_table[e] = prune_row({f: c / total for f, c in row.items()}, top_k)
    return new_table, log_likelihood, scored


def decode_tokens(tokens, tables):
    """Translate a token list word by word with one or more translation tables.

    For each input word the candidate distributions of all tables that know
    the word are averaged and the most probable output word is chosen (ties
    by word, for determinism).  Words no table knows are copied through.
    Returns (output tokens, number of copied unknown words).
    """
    output = []
    unknown = 0
    for word in tokens:
        rows = [table[word] for table in tables if word in table] if word != NULL else []
        if not rows:
            output.append(word)
            unknown += 1
            continue
        if len(rows) == 1:
            scores = rows[0]
        else:
            scores = {}
            for row in rows:
                for f, p in row.items():
                    scores[f] = scores.get(f, 0.0) + p / len(rows)
        best = min(scores.items(), key=lambda item: (-item[1], item[0]))[0]
        output.append(best)
    return output, unknown


# --------------------------------------------------------------------------
# Model / checkpoint files
# --------------------------------------------------------------------------

def model_document(table, epoch, run_args, stats):
    """Build the JSON document used for both checkpoints and final models."""
    return {
        "format": MODEL_FORMAT,
        "version": FORMAT_VERSION,
        "direction": run_args["direction"],
        "epoch": epoch,
        "args": run_args,
        "stats": stats,
        "table": table,
    }


def save_model(path, table, epoch, run_args, stats):
    atomic_write_json(path, model_document(table, epoch, run_args, stats))


def load_model(path):
    """Load a checkpoint or model file and check its structure."""
    doc = read_json(path, "model")
    if not isinstance(doc, dict) or doc.get("format") != MODEL_FORMAT:
        raise MTError(f"{path} is not a {MODEL_FORMAT} model/checkpoint file")
    if doc.get("version") != FORMAT_VERSION:
        raise MTError(f"{path} has unsupported format version {doc.get('version')!r}")
    if doc.get("direction") not in DIRECTIONS:
        raise MTError(f"{path} has an invalid direction {doc.get('direction')!r}")
    if not isinstance(doc.get("epoch"), int) or not isinstance(doc.get("args"), dict):
        raise MTError(f"{path} lacks 'epoch' or 'args'")
    table = doc.get("table")
    if not isinstance(table, dict) or not all(isinstance(row, dict) for row in table.values()):
        raise MTError(f"{path} has a malformed translation table")
    return doc


def load_models(paths):
    """Load several models for ensembling; they must share one direction."""
    docs = [load_model(path) for path in paths]
    directions = {doc["direction"] for doc in docs}
    if len(directions) > 1:
        listing = ", ".join(f"{path} ({doc['direction']})" for path, doc in zip(paths, docs))
        raise MTError(f"cannot ensemble models of different directions: {listing}")
    return docs, docs[0]["direction"]


def seeded_rng(*parts):
    """A random.Random seeded from a stable hash of ``parts`` (not Python's salted hash)."""
    text = "\x1f".join(str(part) for part in parts)
    return random.Random(int(hashlib.sha256(text.encode("utf-8")).hexdigest()[:16], 16))
