#!/usr/bin/env python3
"""Fetch the corpora of one language pair: a training corpus, target-language
monolingual text (for back-translation) and a clean test set.

Two sources:

``--source sample``
    Deterministically generate a synthetic language pair.  The source side is
    English-like text from a small grammar: an embedded list of about 200
    words plus generated personal names, all with Zipf-like frequencies, so
    rare words exist.  The target language -- its sound inventory, its word
    for every English word, which words are ambiguous -- is derived from
    ``--pair`` and ``--seed``, so en-xa and en-xb are different languages.
    Translation is word by word and monotone; a third of the English content
    words have two translations (used 75% / 25% of the time), some target
    words translate two different English words (one article for "the"/"a",
    a few homonyms) and names are transliterated, so the task is learnable
    but not perfectly.  train.tsv additionally gets
    noise that clean_corpus.py must remove: blank lines, lines with an empty
    side, garbage or truncated pairs with a bad length ratio, overlong lines
    and exact duplicates.  mono.txt and test.tsv are clean; test sentences do
    not occur in train.tsv or mono.txt.  Same arguments give byte-identical
    files.

``--source DIR``
    Copy DIR/train.tsv, DIR/mono.txt and DIR/test.tsv (a user's real data).
    --sentences/--mono/--test/--seed are ignored.
"""

import argparse
import os
import re

import mtlib

# --------------------------------------------------------------------------
# The English side: word lists by category, most frequent first.
# --------------------------------------------------------------------------

DETERMINERS = "the a this that some every my your our their".split()
ADJECTIVES = (
    "old big small young good little new long dark red happy quiet strange green cold "
    "bright tall heavy warm blue brave clever gentle lazy loud quick slow sad short proud "
    "wild rich poor wise kind angry tired hungry empty golden silver"
).split()
NOUNS = (
    "man woman child dog house city king friend river tree book road cat teacher "
    "village garden letter door horse water mother father table ship bird song story "
    "school market farmer queen mountain forest window boat bread fire stone car train "
    "field lake sea island castle bridge tower doctor soldier sailor baker painter "
    "student brother sister apple cheese wine chair flower sword coin lamp key box "
    "basket hat coat shoe ring map clock candle mirror wolf fox bear fish church"
).split()
TRANSITIVE_VERBS = (
    "saw found took liked carried built opened visited followed helped called watched "
    "bought sold painted closed cooked washed read wrote lost kept broke fixed pushed "
    "pulled loved met caught chased heard remembered forgot needed hid"
).split()
INTRANSITIVE_VERBS = "slept laughed waited walked ran sang smiled arrived left danced cried fell rested jumped worked".split()
PREPOSITIONS = "in on near with from to under behind over beside across without".split()
ADVERBS = "today again yesterday often soon later always never early late quickly slowly quietly suddenly twice".split()
CONJUNCTIONS = "and but".split()

# Zipf exponent per category: weight of the word of rank r is 1 / r**s.
CATEGORIES = {
    "det": (DETERMINERS, 1.1),
    "adj": (ADJECTIVES, 1.3),
    "noun": (NOUNS, 1.3),
    "vt": (TRANSITIVE_VERBS, 1.3),
    "vi": (INTRANSITIVE_VERBS, 1.2),
    "prep": (PREPOSITIONS, 1.0),
    "adv": (ADVERBS, 1.1),
    "conj": (CONJUNCTIONS, 1.0),
}

# Shape of the synthetic target language.
AMBIGUITY_GROUP = 3          # one content word in three has two translations
MAJOR_SENSE = 0.75           # how often an ambiguous word takes its first translation
HOMONYM_FRACTION = 0.12      # other words whose translation also translates another word
# The target language has one article and one demonstrative: these English
# words share their translation (this makes target->English ambiguous).
MERGED_WORDS = [("a", "the"), ("that", "this")]
CONTENT = ("noun", "adj", "vt", "vi", "adv")

# Personal names: a long tail of rare words.  They are generated per language
# pair, appear as a noun phrase of their own, and are transliterated into the
# target language, so copying an unknown name through is close but wrong.
NAME_COUNT = 600
NAME_ZIPF = 0.8
NAME_RATE = 0.4              # fraction of noun phrases that are a name

CONSONANT_POOL = "p t k b d g m n l r s f v z h j w ch sh th".split()
VOWEL_POOL = "a e i o u y aa ei ou ai".split()
NAME_ONSETS = "b d f g h j k l m n p r s t v w br dr fr gr kr st tr".split()
NAME_VOWELS = "a e i o u a e".split()
NAME_CODAS = "n l r s m d k".split()

PAIR_PATTERN = re.compile(r"^[A-Za-z0-9_]+-[A-Za-z0-9_]+$")


class Language:
    """A generated language pair: target phonology, lexicon and sentence sampler."""

    def __init__(self, pair, seed):
        rng = mtlib.seeded_rng("waypost-sample-language", pair, seed)
        self.consonants = rng.sample(CONSONANT_POOL, rng.randint(9, 13))
        self.vowels = rng.sample(VOWEL_POOL, rng.randint(4, 6))
        # Weights of the syllable shapes CV, CVC, V.
        self.shape_weights = [rng.uniform(4, 7), rng.uniform(1, 3), rng.uniform(0.3, 1.0)]
        self.used = set()
        # Content-word classes carry a language-specific ending, like real
        # inflection; it also gives chrF partial credit for near misses.
        self.endings = {}
        for category in ("noun", "adj", "verb", "name"):
            self.endings[category] = self._fresh(rng, 1, 1, "")
        self.categories = dict(CATEGORIES)
        self.categories["name"] = (self._names(rng), NAME_ZIPF)
        self.lexicon = self._build_lexicon(rng)
        self.word_sampler = {
            category: (words, _cumulative([1.0 / (rank + 1) ** s for rank in range(len(words))]))
            for category, (words, s) in self.categories.items()
        }

    # -- phonology ---------------------------------------------------------

    def _syllable(self, rng):
        shape = rng.choices(("CV", "CVC", "V"), weights=self.shape_weights)[0]
        text = ""
        for slot in shape:
            text += rng.choice(self.consonants if slot == "C" else self.vowels)
        return text

    def _fresh(self, rng, min_syllables, max_syllables, ending):
        """A new target word that was not generated before."""
        while True:
            stem = "".join(self._syllable(rng) for _ in range(rng.randint(min_syllables, max_syllables)))
            word = stem + ending
            if word not in self.used and len(word) >= 2:
                self.used.add(word)
                return word

    def _word_for(self, rng, category):
        if category in ("det", "prep", "conj"):
            return self._fresh(rng, 1, 1, "")
        if category == "adv":
            return self._fresh(rng, 2, 2, "")
        ending = self.endings["verb" if category in ("vt", "vi") else category]
        return self._fresh(rng, 1, 2, ending)

    def _names(self, rng):
        """English-looking personal names, distinct from each other and from the word list."""
        taken = {word for words, _ in CATEGORIES.values() for word in words}
        names = []
        while len(names) < NAME_COUNT:
            name = ""
            for _ in range(rng.randint(2, 3)):
                name += rng.choice(NAME_ONSETS) + rng.choice(NAME_VOWELS)
            if rng.random() < 0.5:
                name += rng.choice(NAME_CODAS)
            if name not in taken:
                taken.add(name)
                names.append(name)
        return names

    def _transliterate(self, rng, name, vowel_map):
        """A name as the target language writes it: vowels shifted, own ending."""
        word = "".join(vowel_map.get(char, char) for char in name) + self.endings["name"]
        while word in self.used:  # clash with an existing target word: vary it
            word += rng.choice(self.vowels)
        self.used.add(word)
        return word

    # -- lexicon -----------------------------------------------------------

    def _build_lexicon(self, rng):
        """Map every English word to its list of translations (first = main sense)."""
        entries = [(word, category) for category, (words, _) in CATEGORIES.items() for word in words]
        category_of = dict(entries)
        lexicon = {word: [self._word_for(rng, category)] for word, category in entries}

        # Homonyms: some words reuse the (main) translation of another word of
        # the same class, which makes translating target->source ambiguous.
        shared = set()
        for word, partner in MERGED_WORDS:
            lexicon[word] = [lexicon[partner][0]]
        candidates = [w for w, c in entries if c not in ("det", "conj")]
        for word in rng.sample(candidates, round(HOMONYM_FRACTION * len(candidates))):
            partner = rng.choice([w for w, c in entries if c == category_of[word] and w != word])
            lexicon[word] = [lexicon[partner][0]]
            shared.update((word, partner))

        # Ambiguity: a third of the content words get a second, less frequent
        # translation (function words keep one).  One word out of every three
        # consecutive frequency ranks of a class is picked, so frequent and
        # rare words are equally affected in every language.  Words with a
        # homonym are avoided where possible: a shared main sense plus a
        # second sense is beyond what a few EM epochs of Model 1 can sort out.
        self.ambiguous = []
        for category in CONTENT:
            words = CATEGORIES[category][0]
            for start in range(0, len(words), AMBIGUITY_GROUP):
                group = words[start:start + AMBIGUITY_GROUP]
                plain = [word for word in group if word not in shared]
                self.ambiguous.append(rng.choice(plain or group))
        self.ambiguous.sort()
        for word in self.ambiguous:
            lexicon[word].append(self._word_for(rng, category_of[word]))

        # Names: transliterated through a per-language vowel shift.
        shifted = rng.sample("aeiou", 5)
        vowel_map = dict(zip("aeiou", shifted))
        for name in self.categories["name"][0]:
            lexicon[name] = [self._transliterate(rng, name, vowel_map)]
        return lexicon

    def shared_count(self):
        """How many English words share their main translation with another word."""
        users = {}
        for senses in self.lexicon.values():
            users[senses[0]] = users.get(senses[0], 0) + 1
        return sum(1 for senses in self.lexicon.values() if users[senses[0]] > 1)

    # -- sentences ---------------------------------------------------------

    def _pick(self, rng, category):
        words, cumulative = self.word_sampler[category]
        return rng.choices(words, cum_weights=cumulative)[0]

    def _noun_phrase(self, rng):
        if rng.random() < NAME_RATE:
            return [self._pick(rng, "name")]
        words = [self._pick(rng, "det")]
        if rng.random() < 0.45:
            words.append(self._pick(rng, "adj"))
            if rng.random() < 0.25:
                words.append(self._pick(rng, "adj"))
        words.append(self._pick(rng, "noun"))
        return words

    def _clause(self, rng):
        words = self._noun_phrase(rng)
        if rng.random() < 0.7:
            words += [self._pick(rng, "vt")] + self._noun_phrase(rng)
        else:
            words.append(self._pick(rng, "vi"))
        if rng.random() < 0.4:
            words += [self._pick(rng, "prep")] + self._noun_phrase(rng)
        if rng.random() < 0.25:
            words.append(self._pick(rng, "adv"))
        return words

    def english(self, rng):
        """One English sentence as a token list."""
        words = self._clause(rng)
        if rng.random() < 0.15:
            words += [self._pick(rng, "conj")] + self._clause(rng)
        return words

    def translate(self, rng, words):
        """Word-by-word translation; ambiguous words pick a sense at random."""
        output = []
        for word in words:
            senses = self.lexicon[word]
            if len(senses) == 1 or rng.random() < MAJOR_SENSE:
                output.append(senses[0])
            else:
                output.append(senses[1])
        return output

    def garbage(self, rng, length):
        """Random pseudo-words of this language (noise for the training corpus)."""
        return [self._syllable(rng) + self._syllable(rng) for _ in range(length)]


def _cumulative(weights):
    total, out = 0.0, []
    for weight in weights:
        total += weight
        out.append(total)
    return out


# --------------------------------------------------------------------------
# Sample data
# --------------------------------------------------------------------------

def generate_sample(pair, seed, sentences, mono, test):
    language = Language(pair, seed)

    # Clean training pairs.
    rng = mtlib.seeded_rng("waypost-sample-train", pair, seed)
    train = []
    for _ in range(sentences):
        english = language.english(rng)
        train.append((english, language.translate(rng, english)))

    # Noise, inserted at random positions.
    noise_rng = mtlib.seeded_rng("waypost-sample-noise", pair, seed)
    lines = [" ".join(src) + "\t" + " ".join(trg) for src, trg in train]
    noise = []
    counts = {
        "blank": max(1, sentences // 100),
        "empty side": max(1, sentences // 100),
        "bad ratio": max(1, sentences * 3 // 100),
        "overlong": max(1, sentences // 200),
        "duplicate": max(1, sentences * 3 // 100),
    }
    for _ in range(counts["blank"]):
        noise.append("")
    for index in range(counts["empty side"]):
        src, trg = train[noise_rng.randrange(len(train))]
        noise.append(" ".join(src) + "\t" if index % 2 == 0 else "\t" + " ".join(trg))
    for index in range(counts["bad ratio"]):
        src = language.english(noise_rng)
        while len(src) < 5:
            src = language.english(noise_rng)
        if index % 2 == 0:   # truncated target: one word left
            trg = language.translate(noise_rng, src)[:1]
        else:                # garbage target, three times too long
            trg = language.garbage(noise_rng, 3 * len(src))
        noise.append(" ".join(src) + "\t" + " ".join(trg))
    for _ in range(counts["overlong"]):
        # Many sentences glued together: a fine translation, but far too long.
        src = []
        while len(src) <= 100:
            src += language.english(noise_rng)
        noise.append(" ".join(src) + "\t" + " ".join(language.translate(noise_rng, src)))
    for _ in range(counts["duplicate"]):
        noise.append(lines[noise_rng.randrange(len(lines))])
    for line in noise:
        lines.insert(noise_rng.randint(0, len(lines)), line)

    # Target-language monolingual text.
    mono_rng = mtlib.seeded_rng("waypost-sample-mono", pair, seed)
    mono_sources = set()
    mono_lines = []
    for _ in range(mono):
        english = language.english(mono_rng)
        mono_sources.add(tuple(english))
        mono_lines.append(" ".join(language.translate(mono_rng, english)))

    # Held-out test pairs: unique, and unseen in train and mono.
    test_rng = mtlib.seeded_rng("waypost-sample-test", pair, seed)
    seen = {tuple(src) for src, _ in train} | mono_sources
    test_pairs = []
    attempts = 0
    while len(test_pairs) < test:
        attempts += 1
        if attempts > 100 * test + 1000:
            raise mtlib.MTError("could not generate enough distinct held-out test sentences")
        english = language.english(test_rng)
        if tuple(english) in seen:
            continue
        seen.add(tuple(english))
        test_pairs.append((" ".join(english), " ".join(language.translate(test_rng, english))))

    info = (
        f"{pair} (seed {seed}): lexicon of {len(language.lexicon) - NAME_COUNT} English words "
        f"+ {NAME_COUNT} names, "
        f"{len(language.ambiguous)} ambiguous, {language.shared_count()} sharing a translation; "
        f"noise added to train: " + ", ".join(f"{n} {kind}" for kind, n in counts.items())
    )
    return lines, mono_lines, test_pairs, info


def copy_directory(directory, out_train, out_mono, out_test):
    """Copy a user's train.tsv / mono.txt / test.tsv into place."""
    if not os.path.isdir(directory):
        raise mtlib.MTError(f"--source must be 'sample' or an existing directory; {directory!r} is neither")
    names = {"train.tsv": out_train, "mono.txt": out_mono, "test.tsv": out_test}
    missing = [name for name in names if not os.path.isfile(os.path.join(directory, name))]
    if missing:
        raise mtlib.MTError(f"{directory} lacks {', '.join(missing)} (need train.tsv, mono.txt and test.tsv)")
    for name, target in names.items():
        path = os.path.join(directory, name)
        lines = mtlib.read_lines(path)  # also checks that the file is UTF-8 text
        if name == "test.tsv":
            mtlib.read_tsv(path)  # the test set must be clean: fail early if not
        with open(path, "rb") as handle:
            mtlib.atomic_write_bytes(target, handle.read())
        mtlib.log(f"copied {path} -> {target} ({len(lines)} lines)")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", required=True, help="language pair, e.g. en-xa")
    parser.add_argument("--source", required=True, help="'sample' or a directory with train.tsv, mono.txt, test.tsv")
    parser.add_argument("--sentences", type=int, default=2000, help="clean training pairs to generate (noise comes on top)")
    parser.add_argument("--mono", type=int, default=1000, help="monolingual target sentences to generate")
    parser.add_argument("--test", type=int, default=300, help="test pairs to generate")
    parser.add_argument("--seed", type=int, default=1, help="generation seed")
    parser.add_argument("--out-train", required=True)
    parser.add_argument("--out-mono", required=True)
    parser.add_argument("--out-test", required=True)
    args = parser.parse_args()

    if not PAIR_PATTERN.match(args.pair):
        raise mtlib.MTError(f"--pair must look like 'en-xa', got {args.pair!r}")

    if args.source != "sample":
        copy_directory(args.source, args.out_train, args.out_mono, args.out_test)
        return

    if args.sentences < 1 or args.test < 1 or args.mono < 0:
        raise mtlib.MTError("--sentences and --test must be at least 1, --mono at least 0")
    lines, mono_lines, test_pairs, info = generate_sample(args.pair, args.seed, args.sentences, args.mono, args.test)
    mtlib.atomic_write_lines(args.out_train, lines)
    mtlib.atomic_write_lines(args.out_mono, mono_lines)
    mtlib.atomic_write_tsv(args.out_test, test_pairs)
    mtlib.log(info)
    mtlib.log(
        f"wrote {args.out_train} ({len(lines)} lines), {args.out_mono} ({len(mono_lines)} lines), "
        f"{args.out_test} ({len(test_pairs)} pairs)"
    )


if __name__ == "__main__":
    mtlib.run_main(main)
