#!/usr/bin/env python3
"""Package a trained model for delivery as a deterministic .tar.gz.

The archive holds, at its top level and in this order:
  MODEL_CARD.md   a short description generated from the three files below
  metrics.json    copied byte for byte from --metrics
  model.json      copied byte for byte from --model
  vocab.json      copied byte for byte from --vocab

Identical inputs give a byte-identical archive: members have fixed mtime (0),
owner (uid/gid 0, no names), mode 0644 and order, and the gzip header carries
no file name or timestamp.  Inputs are checked before anything is written.
"""

import argparse
import gzip
import hashlib
import io
import numbers
import tarfile

import mtlib

FIXED_MTIME = 0


def read_bytes(path, what):
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        raise mtlib.MTError(f"{what} not found: {path}") from None


def model_card(model, vocab, metrics, digests):
    """Markdown description of the packaged model (no paths or dates: deterministic)."""
    args = model["args"]
    stats = model.get("stats") or {}
    corpora = ", ".join(f"`{path}`" for path in args.get("corpus", [])) or "unknown"
    perplexity = stats.get("perplexity")
    lines = [
        "# Model card",
        "",
        f"IBM Model 1 word-by-word translation model, direction **{model['direction']}**.",
        "",
        "## Training",
        "",
        f"- epochs: {model['epoch']}",
        f"- corpora: {corpora}",
        f"- seed: {args.get('seed')}, subsample: {args.get('subsample')}",
        f"- training pairs: {stats.get('pairs', 'unknown')}"
        + (f", final perplexity: {perplexity:.3f}" if isinstance(perplexity, numbers.Real) else ""),
        f"- translation table: {len(model['table'])} input words, top {args.get('top_k', '?')} entries each",
        f"- vocabulary: {len(vocab['src'])} source / {len(vocab['trg'])} target tokens",
        "",
        "## Evaluation",
        "",
        f"- BLEU: {metrics['bleu']:.2f}",
        f"- chrF: {metrics['chrf']:.2f}",
        f"- test sentences: {metrics.get('sentences', 'unknown')}, direction: {metrics.get('direction', 'unknown')}",
        "",
        "## Usage",
        "",
        "Lowercase and whitespace-tokenize the input; replace each word by its most",
        "probable translation in `model.json` (`table[word]`), copying unknown words.",
        "",
        "## Files (SHA-256)",
        "",
    ]
    lines += [f"- `{name}`: {digest}" for name, digest in digests.items()]
    return "\n".join(lines) + "\n"


def tar_member(name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = FIXED_MTIME
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.type = tarfile.REGTYPE
    return info


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="model JSON (usually the student)")
    parser.add_argument("--vocab", required=True, help="vocabulary JSON")
    parser.add_argument("--metrics", required=True, help="metrics JSON from evaluate.py")
    parser.add_argument("--output", required=True, help="archive to write (.tar.gz)")
    args = parser.parse_args()

    # Validate the inputs (these raise MTError with a clear message).
    model = mtlib.load_model(args.model)
    vocab = mtlib.load_vocab(args.vocab)
    metrics = mtlib.read_json(args.metrics, "metrics")
    if not isinstance(metrics, dict) or not all(
        isinstance(metrics.get(key), numbers.Real) for key in ("bleu", "chrf")
    ):
        raise mtlib.MTError(f"{args.metrics} lacks numeric 'bleu' and 'chrf' (not an evaluate.py output?)")
    if metrics.get("direction") not in (None, model["direction"]):
        raise mtlib.MTError(
            f"{args.metrics} scores a {metrics['direction']} model but {args.model} is {model['direction']}"
        )

    files = {
        "metrics.json": read_bytes(args.metrics, "metrics"),
        "model.json": read_bytes(args.model, "model"),
        "vocab.json": read_bytes(args.vocab, "vocabulary"),
    }
    digests = {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}
    members = {"MODEL_CARD.md": model_card(model, vocab, metrics, digests).encode("utf-8")}
    members.update(files)

    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=FIXED_MTIME, compresslevel=9) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name in sorted(members):
            tar.addfile(tar_member(name, members[name]), io.BytesIO(members[name]))
    archive = buffer.getvalue()
    mtlib.atomic_write_bytes(args.output, archive)
    mtlib.log(
        f"packaged {args.model} ({model['direction']}, BLEU {metrics['bleu']:.2f}) with {len(members)} files "
        f"-> {args.output} ({len(archive)} bytes, sha256 {hashlib.sha256(archive).hexdigest()[:16]}...)"
    )


if __name__ == "__main__":
    mtlib.run_main(main)
