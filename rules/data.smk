# Data: fetch the parallel corpus, clean it, build the vocabularies.

rule fetch_corpus:
    input:
        unpack(wp.needs("fetch_corpus")),
    output:
        train=wp.path("fetch_corpus", "train.tsv"),
        mono=wp.path("fetch_corpus", "mono.txt"),
        test=wp.path("fetch_corpus", "test.tsv"),
    resources:
        **wp.resources("fetch_corpus", "cpu"),
    params:
        step=wp.step("fetch_corpus"),
        source=wp.setting("fetch_corpus", "source"),
        sentences=wp.setting("fetch_corpus", "sentences"),
        mono=wp.setting("fetch_corpus", "mono"),
        test=wp.setting("fetch_corpus", "test"),
        seed=wp.setting("fetch_corpus", "seed"),
    shell:
        wp.run + wp.script("fetch_corpus.py") +
        " --pair {wildcards.pair} --source {params.source:q} --sentences {params.sentences}"
        " --mono {params.mono} --test {params.test} --seed {params.seed}"
        " --out-train {output.train} --out-mono {output.mono} --out-test {output.test}"

wp.track(rules.fetch_corpus)


rule clean_corpus:
    input:
        unpack(wp.needs("clean_corpus", train=("fetch_corpus", "train.tsv"))),
    output:
        corpus=wp.path("clean_corpus", "clean.tsv"),
    resources:
        **wp.resources("clean_corpus", "cpu"),
    params:
        step=wp.step("clean_corpus"),
        max_ratio=wp.setting("clean_corpus", "max_ratio"),
        max_length=wp.setting("clean_corpus", "max_length"),
    shell:
        wp.run + wp.script("clean_corpus.py") +
        " --input {input.train} --output {output.corpus}"
        " --max-ratio {params.max_ratio} --max-length {params.max_length}"

wp.track(rules.clean_corpus)


rule train_vocab:
    input:
        unpack(wp.needs("train_vocab", corpus=("clean_corpus", "clean.tsv"), mono=("fetch_corpus", "mono.txt"))),
    output:
        vocab=wp.path("train_vocab", "vocab.json"),
    resources:
        **wp.resources("train_vocab", "cpu"),
    params:
        step=wp.step("train_vocab"),
        min_count=wp.setting("train_vocab", "min_count"),
        max_size=wp.setting("train_vocab", "max_size"),
    shell:
        wp.run + wp.script("train_vocab.py") +
        " --corpus {input.corpus} --mono {input.mono} --output {output.vocab}"
        " --min-count {params.min_count} --max-size {params.max_size}"

wp.track(rules.train_vocab)
