#!/usr/bin/env python3
"""Build source and target vocabularies.

The source vocabulary counts the tokens of the corpus's source column; the
target vocabulary counts the corpus's target column plus the monolingual
target text.  Tokens are lowercased and whitespace-split (as everywhere in
this pipeline).  Each vocabulary keeps tokens seen at least --min-count
times, at most --max-size of them, most frequent first (ties alphabetical).

Output JSON: {"format": "waypost-vocab", "version": 1, "min_count": .., "max_size": ..,
"sizes": {"src": n, "trg": n}, "src": {token: count, ...}, "trg": {token: count, ...}}
"""

import argparse
from collections import Counter

import mtlib


def top_tokens(counter, min_count, max_size):
    """The most frequent tokens (ties alphabetical) with count >= min_count, at most max_size."""
    ranked = sorted(counter.items(), key=lambda item: (-item[1], item[0]))
    kept = [(token, count) for token, count in ranked if count >= min_count]
    return dict(kept[:max_size])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", required=True, help="clean parallel corpus (TSV)")
    parser.add_argument("--mono", help="monolingual target-language text (optional)")
    parser.add_argument("--output", required=True, help="vocabulary JSON to write")
    parser.add_argument("--min-count", type=int, default=1, help="drop tokens seen fewer times")
    parser.add_argument("--max-size", type=int, default=5000, help="keep at most this many tokens per side")
    args = parser.parse_args()
    if args.min_count < 1 or args.max_size < 1:
        raise mtlib.MTError("--min-count and --max-size must be at least 1")

    pairs = mtlib.read_tsv(args.corpus)
    src_counts, trg_counts = Counter(), Counter()
    for src, trg in pairs:
        src_counts.update(mtlib.tokenize(src))
        trg_counts.update(mtlib.tokenize(trg))
    mono_lines = 0
    if args.mono:
        lines, _ = mtlib.read_text(args.mono)
        mono_lines = len(lines)
        for line in lines:
            trg_counts.update(mtlib.tokenize(line))

    vocab = {
        "format": mtlib.VOCAB_FORMAT,
        "version": mtlib.FORMAT_VERSION,
        "min_count": args.min_count,
        "max_size": args.max_size,
    }
    src = top_tokens(src_counts, args.min_count, args.max_size)
    trg = top_tokens(trg_counts, args.min_count, args.max_size)
    vocab["sizes"] = {"src": len(src), "trg": len(trg)}
    vocab["src"] = src
    vocab["trg"] = trg
    mtlib.atomic_write_json(args.output, vocab)
    mtlib.log(
        f"{len(pairs)} pairs + {mono_lines} mono lines: src vocab {len(src)} of {len(src_counts)} types, "
        f"trg vocab {len(trg)} of {len(trg_counts)} types -> {args.output}"
    )


if __name__ == "__main__":
    mtlib.run_main(main)
