"""Writes the example's small corpora (data/<pair>/): a parallel corpus with
some noise (words out of order, misaligned lines, empty and duplicate lines), monolingual
target-side text for back-translation, and a test set. Two synthetic
"languages": German is each word reversed, French each word with its vowels
rotated. --lines N makes more (the same lines, and more after them)."""

import argparse
import random
from pathlib import Path

WORDS = ("the a cat dog bird fish sees eats likes finds small big red old green house tree river "
         "boat car road city park day night sun rain and with near under over").split()
RARE = "teacher student ensemble checkpoint shard".split()
LANGS = {"de": lambda w: w[::-1], "fr": lambda w: w.translate(str.maketrans("aeiou", "eioua")) + "s"}


def sentence(rng: random.Random) -> list[str]:
    words = [rng.choice(WORDS) for _ in range(rng.randint(3, 7))]
    if rng.random() < 0.15:
        words[rng.randrange(len(words))] = rng.choice(RARE)
    return words


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "data"))
    parser.add_argument("--lines", type=int, default=60, help="corpus lines per pair (and half as many of text)")
    parser.add_argument("--pair", action="append", choices=[f"en-{lang}" for lang in LANGS],
                        help="only this pair (repeatable)")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    for lang, translate in LANGS.items():
        if args.pair and f"en-{lang}" not in args.pair:
            continue
        rng = random.Random(f"{args.seed}-{lang}")
        out = Path(args.out) / f"en-{lang}"
        out.mkdir(parents=True, exist_ok=True)
        corpus = []
        for _ in range(args.lines):
            src = sentence(rng)
            trg = [translate(w) for w in src]
            if rng.random() < 0.15:     # noise: the words out of order, or another sentence's
                trg = rng.sample(trg, len(trg)) if rng.random() < 0.7 else [translate(w) for w in sentence(rng)]
            corpus.append(f"{' '.join(src)}\t{' '.join(trg)}")
        corpus[5:5] = ["\t", corpus[3]]   # an empty line and a duplicate, for clean_corpus
        (out / "corpus.tsv").write_text("".join(line + "\n" for line in corpus))
        rng = random.Random(f"{args.seed}-{lang}-mono")   # (more lines: the same ones, and more)
        mono = [" ".join(translate(w) for w in sentence(rng)) for _ in range(args.lines // 2)]
        (out / "mono.txt").write_text("".join(line + "\n" for line in mono))
        rng = random.Random(f"{args.seed}-{lang}-test")
        test = [sentence(rng) for _ in range(12)]
        (out / "devtest.tsv").write_text("".join(
            f"{' '.join(s)}\t{' '.join(translate(w) for w in s)}\n" for s in test))


if __name__ == "__main__":
    main()
