#!/usr/bin/env python3
"""Translate text word by word with one IBM Model 1 or an ensemble of them.

Each input word becomes the output word with the highest translation
probability, averaged over all given models that know the word; words no
model knows are copied through.  All models must have the same direction.

Input is either a plain text file (--input-text, one sentence per line,
blank lines skipped) in the models' input language, or one column of a
parallel TSV (--input-tsv with --column); the column must be the models'
input side (src for src-trg models, trg for trg-src models).

Output orientation: the output TSV is always a src<TAB>trg parallel corpus in
the direction of the forward (src-trg) pipeline, so it can be fed straight to
train_model.py:
  * src-trg models (e.g. distillation of the src column by a teacher
    ensemble) write   original src <TAB> translation;
  * trg-src models (e.g. back-translation of target mono text) write
    translation <TAB> original trg.
The original side is written whitespace-normalised, otherwise unchanged.
"""

import argparse

import mtlib


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append", required=True, help="model JSON; repeat to ensemble")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--input-text", help="plain text, one sentence per line, in the models' input language")
    source.add_argument("--input-tsv", help="parallel TSV; translate the column named by --column")
    parser.add_argument("--column", choices=("src", "trg"), help="column of --input-tsv to translate")
    parser.add_argument("--output", required=True, help="output TSV (src<TAB>trg, see above)")
    args = parser.parse_args()

    docs, direction = mtlib.load_models(args.model)
    in_side, _ = mtlib.direction_sides(direction)

    if args.input_tsv:
        if args.column is None:
            raise mtlib.MTError("--input-tsv needs --column src|trg")
        if args.column != in_side:
            raise mtlib.MTError(
                f"--column {args.column} does not fit {direction} models, which translate the {in_side} column"
            )
        pairs = mtlib.read_tsv(args.input_tsv)
        sentences = [src if args.column == "src" else trg for src, trg in pairs]
        input_path, skipped = args.input_tsv, 0
    else:
        if args.column is not None:
            raise mtlib.MTError("--column only applies to --input-tsv")
        sentences, skipped = mtlib.read_text(args.input_text)
        input_path = args.input_text
    if not sentences:
        raise mtlib.MTError(f"nothing to translate in {input_path}")

    tables = [doc["table"] for doc in docs]
    out_pairs = []
    tokens = unknown = 0
    for sentence in sentences:
        words = mtlib.tokenize(sentence)
        translation, copied = mtlib.decode_tokens(words, tables)
        tokens += len(words)
        unknown += copied
        original = " ".join(sentence.split())
        hypothesis = " ".join(translation)
        out_pairs.append((original, hypothesis) if direction == "src-trg" else (hypothesis, original))

    mtlib.atomic_write_tsv(args.output, out_pairs)
    mtlib.log(
        f"translated {len(sentences)} sentences ({tokens} tokens, {unknown} unknown copied"
        + (f", {skipped} blank lines skipped" if skipped else "")
        + f") from {input_path} with {len(docs)} {direction} model(s) -> {args.output}"
    )


if __name__ == "__main__":
    mtlib.run_main(main)
