# Back-translation: a target→source model turns monolingual target text into
# synthetic parallel data for the teachers.

rule train_backward:
    input:
        corpus=wp.stage("clean_corpus", "clean.tsv"),
        vocab=wp.stage("train_vocab", "vocab.json"),
    output:
        model=wp.out("model.json"),
    resources:
        worker="gpu",
    params:
        epochs=wp.setting("epochs"),
        seed=wp.setting("seed", 0),
        subsample=wp.setting("subsample", 1.0),
    shell:
        wp.script("../scripts/train_model.py") + " --corpus {input.corpus} --direction trg-src --vocab {input.vocab}"
        " --epochs {params.epochs} --seed {params.seed} --subsample {params.subsample}"
        " --checkpoint-dir $WAYPOST_STAGE_DIR/checkpoints --output {output.model}"


rule translate_mono:
    input:
        model=wp.stage("train_backward", "model.json"),
        mono=wp.stage("fetch_corpus", "mono.txt"),
    output:
        corpus=wp.out("backtranslated.tsv"),
    resources:
        worker="gpu",
    shell:
        wp.script("../scripts/translate.py") + " --model {input.model} --input-text {input.mono} --output {output.corpus}"
