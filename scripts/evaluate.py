#!/usr/bin/env python3
"""Evaluate one model (or an ensemble) on a parallel test set with sacrebleu.

The test set is translated in the models' direction: src-trg models translate
the src column and are scored against trg; trg-src models translate the trg
column and are scored against src.  Scores are sacrebleu corpus BLEU and chrF
with default settings.

Output JSON: {"bleu": .., "chrf": .., "direction": .., "sentences": n,
"unknown_tokens": n, "model": [paths], "test": path, "signature": {..}}
"""

import argparse

import mtlib


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append", required=True, help="model JSON; repeat to ensemble")
    parser.add_argument("--test", required=True, help="clean parallel test set (TSV)")
    parser.add_argument("--output", required=True, help="metrics JSON to write")
    parser.add_argument("--hypotheses", help="also write the translations here, one per line")
    args = parser.parse_args()

    # Imported here so that --help works without sacrebleu installed.
    from sacrebleu.metrics import BLEU, CHRF

    docs, direction = mtlib.load_models(args.model)
    in_side, _ = mtlib.direction_sides(direction)
    pairs = mtlib.read_tsv(args.test)
    if not pairs:
        raise mtlib.MTError(f"test set {args.test} is empty")

    tables = [doc["table"] for doc in docs]
    hypotheses, references = [], []
    unknown = 0
    for src, trg in pairs:
        source, reference = (src, trg) if in_side == "src" else (trg, src)
        translation, copied = mtlib.decode_tokens(mtlib.tokenize(source), tables)
        unknown += copied
        hypotheses.append(" ".join(translation))
        references.append(" ".join(reference.split()))

    bleu, chrf = BLEU(), CHRF()
    bleu_score = bleu.corpus_score(hypotheses, [references])
    chrf_score = chrf.corpus_score(hypotheses, [references])
    metrics = {
        "bleu": round(bleu_score.score, 4),
        "chrf": round(chrf_score.score, 4),
        "direction": direction,
        "sentences": len(pairs),
        "unknown_tokens": unknown,
        "model": list(args.model),
        "test": args.test,
        "signature": {"bleu": str(bleu.get_signature()), "chrf": str(chrf.get_signature())},
    }
    if args.hypotheses:
        mtlib.atomic_write_lines(args.hypotheses, hypotheses)
    mtlib.atomic_write_json(args.output, metrics)
    mtlib.log(
        f"{direction} ({len(docs)} model(s)) on {len(pairs)} test sentences: "
        f"BLEU {metrics['bleu']:.2f}  chrF {metrics['chrf']:.2f}  ({unknown} unknown tokens) -> {args.output}"
    )


if __name__ == "__main__":
    mtlib.run_main(main)
