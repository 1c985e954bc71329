#!/usr/bin/env python3
"""Train an IBM Model 1 translation table with EM, checkpointing every epoch.

The model reads the input side of --direction (src for src-trg, trg for
trg-src) and learns t(output word | input word), with a NULL input word that
output words may also align to.  Tokens not in the vocabulary (--vocab) are
ignored for training.  EM starts from a uniform table over co-occurring word
pairs, perturbed by --seed; --subsample trains on a seeded random fraction of
the sentence pairs (so ensemble members differ).  After each epoch the table
is pruned to the top entries per input word.

Checkpoints: after every epoch <checkpoint-dir>/epoch-NNN.json is written
atomically.  On start the latest checkpoint (up to --epochs) is resumed from
and only the remaining epochs are run; if all epochs are done the output is
written straight away.  A checkpoint from a run with a different direction,
corpus list (paths or contents), vocabulary, seed or subsample is an error,
never silently resumed.  --epochs may grow between runs to train further.

The output model has the same JSON format as a checkpoint:
{"format": "waypost-ibm1", "version": 1, "direction": .., "epoch": ..,
 "args": {..}, "stats": {..}, "table": {input word: {output word: p, ..}, ..}}
"""

import argparse
import math
import os
import re

import mtlib

CHECKPOINT_NAME = re.compile(r"^epoch-(\d{3,})\.json$")
STALE_TEMP = re.compile(r"^\.epoch-\d{3,}\.json\..*\.tmp$")

# Arguments that must match for a checkpoint to be resumed.
COMPATIBILITY_KEYS = ("direction", "corpus", "corpus_sha256", "vocab_sha256", "seed", "subsample", "top_k")


def load_pairs(paths, direction, vocab):
    """Read the corpora, orient them as (input tokens, output tokens) and drop OOV tokens."""
    in_side, out_side = mtlib.direction_sides(direction)
    in_vocab, out_vocab = vocab[in_side], vocab[out_side]
    pairs = []
    read = dropped_tokens = dropped_pairs = 0
    for path in paths:
        for src, trg in mtlib.read_tsv(path):
            read += 1
            sides = {"src": mtlib.tokenize(src), "trg": mtlib.tokenize(trg)}
            inputs = [w for w in sides[in_side] if w in in_vocab]
            outputs = [w for w in sides[out_side] if w in out_vocab]
            dropped_tokens += len(sides[in_side]) - len(inputs) + len(sides[out_side]) - len(outputs)
            if inputs and outputs:
                pairs.append((inputs, outputs))
            else:
                dropped_pairs += 1
    return pairs, read, dropped_tokens, dropped_pairs


def subsample_pairs(pairs, fraction, seed):
    """A seeded random subset (in corpus order) of about ``fraction`` of the pairs."""
    if fraction >= 1.0:
        return pairs
    keep = max(1, round(fraction * len(pairs)))
    rng = mtlib.seeded_rng("waypost-subsample", seed)
    return [pairs[i] for i in sorted(rng.sample(range(len(pairs)), keep))]


def find_checkpoints(directory):
    """{epoch: path} of the checkpoints in ``directory``; removes stale temp files."""
    found = {}
    for name in sorted(os.listdir(directory)):
        match = CHECKPOINT_NAME.match(name)
        if match:
            found[int(match.group(1))] = os.path.join(directory, name)
        elif STALE_TEMP.match(name):
            os.unlink(os.path.join(directory, name))  # an interrupted atomic write
    return found


def check_compatible(path, checkpoint, run_args):
    """Fail clearly if a checkpoint was written by a different training run."""
    differences = []
    for key in COMPATIBILITY_KEYS:
        if checkpoint["args"].get(key) != run_args[key]:
            differences.append(f"{key}: checkpoint has {checkpoint['args'].get(key)!r}, this run {run_args[key]!r}")
    if differences:
        raise mtlib.MTError(
            f"checkpoint {path} belongs to a different training run and cannot be resumed:\n  "
            + "\n  ".join(differences)
            + f"\nremove {os.path.dirname(path) or '.'} or use another --checkpoint-dir"
        )


def epoch_stats(pairs, log_likelihood, scored):
    return {
        "pairs": len(pairs),
        "output_tokens": scored,
        "log_likelihood": round(log_likelihood, 6),
        "perplexity": round(math.exp(-log_likelihood / scored), 6) if scored else None,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", action="append", required=True, help="parallel corpus (TSV); repeat to combine several")
    parser.add_argument("--direction", required=True, choices=mtlib.DIRECTIONS, help="src-trg or trg-src")
    parser.add_argument("--vocab", required=True, help="vocabulary JSON from train_vocab.py")
    parser.add_argument("--epochs", type=int, default=5, help="total EM epochs")
    parser.add_argument("--seed", type=int, default=0, help="seed for initialisation and subsampling")
    parser.add_argument("--subsample", type=float, default=1.0, help="fraction of sentence pairs to train on (0, 1]")
    parser.add_argument("--checkpoint-dir", required=True, help="directory for epoch-NNN.json checkpoints")
    parser.add_argument("--output", required=True, help="final model JSON")
    args = parser.parse_args()
    if args.epochs < 1:
        raise mtlib.MTError("--epochs must be at least 1")
    if not 0.0 < args.subsample <= 1.0:
        raise mtlib.MTError("--subsample must be in (0, 1]")

    vocab = mtlib.load_vocab(args.vocab)
    corpus_paths = [os.path.normpath(path) for path in args.corpus]
    run_args = {
        "direction": args.direction,
        "corpus": corpus_paths,
        "corpus_sha256": [mtlib.file_sha256(path) for path in corpus_paths],
        "vocab": os.path.normpath(args.vocab),
        "vocab_sha256": mtlib.file_sha256(args.vocab),
        "seed": args.seed,
        "subsample": args.subsample,
        "top_k": mtlib.TOP_K,
        "epochs": args.epochs,
    }

    all_pairs, read, dropped_tokens, dropped_pairs = load_pairs(corpus_paths, args.direction, vocab)
    pairs = subsample_pairs(all_pairs, args.subsample, args.seed)
    if not pairs:
        raise mtlib.MTError("no training pairs left after vocabulary restriction")
    mtlib.log(
        f"{args.direction}: {read} pairs read from {len(corpus_paths)} corpus file(s), "
        f"{dropped_pairs} dropped (empty after vocab restriction), {dropped_tokens} OOV tokens ignored; "
        f"training on {len(pairs)} pairs (subsample {args.subsample}, seed {args.seed})"
    )

    # Resume from the latest usable checkpoint, if any.
    os.makedirs(args.checkpoint_dir, exist_ok=True)
    checkpoints = find_checkpoints(args.checkpoint_dir)
    usable = [epoch for epoch in checkpoints if epoch <= args.epochs]
    if len(usable) < len(checkpoints):
        mtlib.log(f"ignoring checkpoints beyond epoch {args.epochs}")
    start_epoch, table, stats = 0, None, None
    if usable:
        start_epoch = max(usable)
        path = checkpoints[start_epoch]
        checkpoint = mtlib.load_model(path)
        if checkpoint["epoch"] != start_epoch:
            raise mtlib.MTError(f"{path} says it is epoch {checkpoint['epoch']}, not {start_epoch}")
        check_compatible(path, checkpoint, run_args)
        table, stats = checkpoint["table"], checkpoint.get("stats")
        mtlib.log(f"resuming from epoch {start_epoch} ({path})")
    else:
        table = mtlib.init_table(pairs, mtlib.seeded_rng("waypost-init", args.seed))

    for epoch in range(start_epoch + 1, args.epochs + 1):
        table, log_likelihood, scored = mtlib.em_epoch(pairs, table)
        stats = epoch_stats(pairs, log_likelihood, scored)
        path = os.path.join(args.checkpoint_dir, f"epoch-{epoch:03d}.json")
        mtlib.save_model(path, table, epoch, run_args, stats)
        mtlib.log(
            f"epoch {epoch}/{args.epochs}: perplexity {stats['perplexity']:.3f} "
            f"over {scored} tokens, {len(table)} input words -> {path}"
        )
    if start_epoch == args.epochs:
        mtlib.log(f"all {args.epochs} epochs already done")

    mtlib.save_model(args.output, table, args.epochs, run_args, stats)
    mtlib.log(f"wrote {args.output}")


if __name__ == "__main__":
    mtlib.run_main(main)
