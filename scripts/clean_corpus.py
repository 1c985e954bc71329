#!/usr/bin/env python3
"""Clean a parallel corpus (``src<TAB>trg`` per line).

Filters, applied in this order (a line is counted under the first that drops it):

  blank       the line is empty or only whitespace
  malformed   the line does not have exactly one tab
  empty side  the source or the target side is empty
  too long    either side has more than --max-length tokens
  ratio       the token-length ratio (longer / shorter side) exceeds --max-ratio
  duplicate   the (source, target) pair already occurred earlier

Kept lines are written unchanged except for stripped surrounding whitespace
on each side, in their original order.  Per-filter counts go to stderr.
"""

import argparse

import mtlib

FILTERS = ("blank", "malformed", "empty side", "too long", "ratio", "duplicate")


def classify(line, max_length, max_ratio, seen):
    """Return (name of the filter that rejects the line or None, cleaned pair)."""
    if not line.strip():
        return "blank", None
    pair = mtlib.split_pair(line)
    if pair is None:
        return "malformed", None
    src, trg = pair[0].strip(), pair[1].strip()
    src_len, trg_len = len(mtlib.tokenize(src)), len(mtlib.tokenize(trg))
    if src_len == 0 or trg_len == 0:
        return "empty side", None
    if src_len > max_length or trg_len > max_length:
        return "too long", None
    if max(src_len, trg_len) / min(src_len, trg_len) > max_ratio:
        return "ratio", None
    if (src, trg) in seen:
        return "duplicate", None
    seen.add((src, trg))
    return None, (src, trg)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", required=True, help="raw parallel corpus (TSV)")
    parser.add_argument("--output", required=True, help="cleaned parallel corpus (TSV)")
    parser.add_argument("--max-ratio", type=float, default=2.0, help="largest allowed token-length ratio (>= 1)")
    parser.add_argument("--max-length", type=int, default=80, help="largest allowed side length in tokens")
    args = parser.parse_args()
    if args.max_ratio < 1.0:
        raise mtlib.MTError("--max-ratio must be at least 1.0")
    if args.max_length < 1:
        raise mtlib.MTError("--max-length must be at least 1")

    lines = mtlib.read_lines(args.input)
    removed = {name: 0 for name in FILTERS}
    kept = []
    seen = set()
    for line in lines:
        reason, pair = classify(line, args.max_length, args.max_ratio, seen)
        if reason:
            removed[reason] += 1
        else:
            kept.append(pair)
    if not kept:
        raise mtlib.MTError(f"no usable sentence pairs left in {args.input} ({len(lines)} lines read)")

    mtlib.atomic_write_tsv(args.output, kept)
    mtlib.log(f"read {len(lines)} lines from {args.input}, kept {len(kept)} -> {args.output}")
    mtlib.log("removed: " + ", ".join(f"{name} {count}" for name, count in removed.items()))


if __name__ == "__main__":
    mtlib.run_main(main)
