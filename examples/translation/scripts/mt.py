"""The example's steps: a word-by-word "translation model" (counts of which
target word each source word is aligned with, by position), and what a
translation-training pipeline does with it. Small and fast on purpose; each
subcommand reads and writes the files a real step of its kind would.

  clean      drop empty, duplicate and badly mismatched lines of a corpus
  train      learn a model from corpora (position-aligned, or by alignments)
  translate  translate a corpus or a text, word by word, with a score per line
  best       the best of an ensemble's translations of each line
  collect    put the parts of a corpus back together
  filter     drop the lines whose score is under a threshold
  align      word alignments of a corpus
  evaluate   word accuracy of models on a test set
  export     the model to ship and what is known of it
  report     a Markdown report over every pair of an experiment
"""

import argparse
import json
import shutil
import sys
import zlib
from collections import Counter, defaultdict
from pathlib import Path


def lines(path):
    return Path(path).read_text().splitlines()


def write_lines(path, rows):
    Path(path).write_text("".join(row + "\n" for row in rows))


def pairs(path):
    for line in lines(path):
        src, _, trg = line.partition("\t")
        yield src.split(), trg.split(), line


def clean(args):
    seen, kept = set(), []
    for src, trg, line in pairs(args.input):
        if not src or not trg or line in seen or max(len(src), len(trg)) > 1.5 * min(len(src), len(trg)):
            continue
        seen.add(line)
        kept.append(line)
    write_lines(args.output, kept)
    print(f"clean: kept {len(kept)} of {len(lines(args.input))} lines")


def train(args):
    counts = defaultdict(Counter)
    if args.init:
        for word, targets in json.loads(Path(args.init).read_text())["counts"].items():
            counts[word].update(targets)
    used = 0
    links = iter(lines(args.alignments)) if args.alignments else None
    for corpus in args.corpus:
        for src, trg, line in pairs(corpus):
            if args.direction == "trg-src":
                src, trg = trg, src
            if args.member and zlib.crc32(f"{args.member}:{line}".encode()) % 4 == 0:
                continue      # each ensemble member sees its own three quarters of the data
            if links is not None:
                aligned = [tuple(map(int, link.split("-"))) for link in next(links).split()]
            elif len(src) == len(trg):
                aligned = [(i, i) for i in range(len(src))]
            else:
                continue
            for i, j in aligned:
                counts[src[i]][trg[j]] += 1
            used += 1
    if args.vocab:
        frequent = sorted(counts, key=lambda w: (-sum(counts[w].values()), w))[:args.vocab]
        counts = {w: counts[w] for w in frequent}
    Path(args.output).write_text(json.dumps({"counts": counts, "lines": used}, sort_keys=True))
    print(f"train: {len(counts)} words from {used} lines")


def translate_words(model, words):
    out, confidence = [], []
    for word in words:
        targets = model.get(word)
        if not targets:
            out.append(word)
            confidence.append(0.0)
            continue
        best, n = max(targets.items(), key=lambda item: (item[1], item[0]))
        out.append(best)
        confidence.append(n / sum(targets.values()))
    return out, sum(confidence) / max(len(confidence), 1)


def translate(args):
    model = json.loads(Path(args.model).read_text())["counts"]
    rows, scores = [], []
    for line in lines(args.input):
        text = line.split("\t")[0].split()
        out, score = translate_words(model, text)
        scores.append(score)
        if args.backward:      # a synthetic source for a real target: a corpus line
            rows.append(f"{' '.join(out)}\t{' '.join(text)}")
        else:
            rows.append(f"{' '.join(text)}\t{' '.join(out)}\t{score:.3f}")
    write_lines(args.output, rows)
    print(f"translate: {args.about or args.input}: {len(rows)} lines, mean score {sum(scores) / max(len(scores), 1):.3f}")


def best(args):
    """The ensemble's translation of each line: the best-scoring of its members'."""
    found, order = {}, []
    for path in args.inputs:
        for line in lines(path):
            src, hyp, score = line.split("\t")
            if src not in found:
                order.append(src)
            if src not in found or float(score) > float(found[src][1]):
                found[src] = (hyp, score)
    write_lines(args.output, [f"{src}\t{found[src][0]}\t{found[src][1]}" for src in order])


def collect(args):
    rows = [line for path in args.inputs for line in lines(path)]
    write_lines(args.output, rows)
    Path(args.stats).write_text(json.dumps({"parts": len(args.inputs), "lines": len(rows)}))


def filter_(args):
    rows = [line.split("\t") for line in lines(args.input)]
    kept = [f"{src}\t{hyp}" for src, hyp, score in rows if float(score) >= args.threshold]
    write_lines(args.output, kept)
    Path(args.stats).write_text(json.dumps({"distilled": len(rows), "kept": len(kept)}))
    print(f"filter: kept {len(kept)} of {len(rows)} lines (score >= {args.threshold})")


def align(args):
    rows = []
    for src, trg, _ in pairs(args.input):
        rows.append(" ".join(f"{i}-{i}" for i in range(min(len(src), len(trg)))))
    write_lines(args.output, rows)


def evaluate(args):
    test = list(pairs(args.test))
    scores = {}
    for spec in args.model:
        name, _, path = spec.partition("=")
        model = json.loads(Path(path).read_text())["counts"]
        right = total = 0
        for src, ref, _ in test:
            out, _ = translate_words(model, src)
            right += sum(a == b for a, b in zip(out, ref))
            total += len(ref)
        scores[name] = round(100 * right / total, 1)
    Path(args.output).write_text(json.dumps(scores, indent=1))


def export(args):
    shutil.copyfile(args.model, args.output)
    about = {"pair": args.pair, "scores": json.loads(Path(args.scores).read_text()),
             "mono": json.loads(Path(args.mono).read_text()), "corpus": json.loads(Path(args.corpus).read_text()),
             "filter": json.loads(Path(args.filter).read_text())}
    Path(args.about).write_text(json.dumps(about, indent=1))


def report(args):
    rows = [json.loads(Path(path).read_text()) for path in args.inputs]
    out = [f"# Experiment {args.experiment}", "",
           "| pair | teachers | mono parts | corpus parts | translations | distilled | kept | best teacher | student"
           " | finetuned |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in sorted(rows, key=lambda r: r["pair"]):
        scores = row["scores"]
        teachers = {k: v for k, v in scores.items() if k.startswith("teacher-")}
        parts = row["corpus"]["parts"]
        out.append(f"| {row['pair']} | {len(teachers)} | {row['mono']['parts']} | {parts} | "
                   f"{parts * len(teachers)} | {row['filter']['distilled']} | {row['filter']['kept']} | "
                   f"{max(teachers.values())} | {scores['student']} | {scores['finetuned']} |")
    out += ["", "Scores: word accuracy (%) on each pair's test set."]
    write_lines(args.output, out)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("clean")
    p.add_argument("--input", required=True)
    p.add_argument("--output", required=True)
    p = sub.add_parser("train")
    p.add_argument("--corpus", action="append", required=True)
    p.add_argument("--direction", choices=["src-trg", "trg-src"], default="src-trg")
    p.add_argument("--member", default="", help="an ensemble member's name: it trains on its own subsample")
    p.add_argument("--alignments")
    p.add_argument("--vocab", type=int, default=0, help="keep the most frequent source words only")
    p.add_argument("--init", help="a model to continue from")
    p.add_argument("--output", required=True)
    p = sub.add_parser("translate")
    p.add_argument("--model", required=True)
    p.add_argument("--input", required=True)
    p.add_argument("--backward", action="store_true")
    p.add_argument("--about", default="", help="what it translates, for the log")
    p.add_argument("--output", required=True)
    p = sub.add_parser("best")
    p.add_argument("inputs", nargs="+")
    p.add_argument("--output", required=True)
    p = sub.add_parser("collect")
    p.add_argument("inputs", nargs="+")
    p.add_argument("--output", required=True)
    p.add_argument("--stats", required=True)
    p = sub.add_parser("filter")
    p.add_argument("--input", required=True)
    p.add_argument("--threshold", type=float, required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--stats", required=True)
    p = sub.add_parser("align")
    p.add_argument("--input", required=True)
    p.add_argument("--output", required=True)
    p = sub.add_parser("evaluate")
    p.add_argument("--test", required=True)
    p.add_argument("--model", action="append", required=True, help="NAME=PATH")
    p.add_argument("--output", required=True)
    p = sub.add_parser("export")
    for name in ("pair", "model", "scores", "mono", "corpus", "filter", "output", "about"):
        p.add_argument(f"--{name}", required=True)
    p = sub.add_parser("report")
    p.add_argument("inputs", nargs="+")
    p.add_argument("--experiment", required=True)
    p.add_argument("--output", required=True)
    args = parser.parse_args(argv)
    {"clean": clean, "train": train, "translate": translate, "best": best, "collect": collect, "filter": filter_,
     "align": align, "evaluate": evaluate, "export": export, "report": report}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
