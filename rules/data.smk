# Data: fetch the parallel corpus, clean it, build the vocabularies.

rule fetch_corpus:
    output:
        train=wp.out("train.tsv"),
        mono=wp.out("mono.txt"),
        test=wp.out("test.tsv"),
    params:
        source=wp.setting("source"),
        sentences=wp.setting("sentences"),
        mono=wp.setting("mono"),
        test=wp.setting("test"),
        seed=wp.setting("seed"),
    shell:
        wp.script("../scripts/fetch_corpus.py") + " --pair {wildcards.pair} --source {params.source:q}"
        " --sentences {params.sentences} --mono {params.mono} --test {params.test} --seed {params.seed}"
        " --out-train {output.train} --out-mono {output.mono} --out-test {output.test}"


rule clean_corpus:
    input:
        train=wp.stage("fetch_corpus", "train.tsv"),
    output:
        corpus=wp.out("clean.tsv"),
    params:
        max_ratio=wp.setting("max_ratio"),
        max_length=wp.setting("max_length"),
    shell:
        wp.script("../scripts/clean_corpus.py") + " --input {input.train} --output {output.corpus}"
        " --max-ratio {params.max_ratio} --max-length {params.max_length}"


rule train_vocab:
    input:
        corpus=wp.stage("clean_corpus", "clean.tsv"),
        mono=wp.stage("fetch_corpus", "mono.txt"),
    output:
        vocab=wp.out("vocab.json"),
    params:
        min_count=wp.setting("min_count"),
        max_size=wp.setting("max_size"),
    shell:
        wp.script("../scripts/train_vocab.py") + " --corpus {input.corpus} --mono {input.mono} --output {output.vocab}"
        " --min-count {params.min_count} --max-size {params.max_size}"
