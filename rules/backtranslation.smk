# Back-translation: a target→source model turns monolingual target text into
# synthetic parallel data for the teachers.

rule train_backward:
    input:
        unpack(wp.needs("train_backward", corpus=("clean_corpus", "clean.tsv"), vocab=("train_vocab", "vocab.json"))),
    output:
        model=wp.path("train_backward", "model.json"),
    resources:
        **wp.resources("train_backward", "gpu"),
    params:
        step=wp.step("train_backward"),
        epochs=wp.setting("train_backward", "epochs"),
        seed=wp.setting("train_backward", "seed", 0),
        subsample=wp.setting("train_backward", "subsample", 1.0),
        checkpoints=lambda wc, output: os.path.join(os.path.dirname(output.model), "checkpoints"),
    shell:
        wp.run + wp.script("train_model.py") +
        " --corpus {input.corpus} --direction trg-src --vocab {input.vocab}"
        " --epochs {params.epochs} --seed {params.seed} --subsample {params.subsample}"
        " --checkpoint-dir {params.checkpoints} --output {output.model}"

wp.track(rules.train_backward)


rule translate_mono:
    input:
        unpack(wp.needs("translate_mono", model=("train_backward", "model.json"), mono=("fetch_corpus", "mono.txt"))),
    output:
        corpus=wp.path("translate_mono", "backtranslated.tsv"),
    resources:
        **wp.resources("translate_mono", "gpu"),
    params:
        step=wp.step("translate_mono"),
    shell:
        wp.run + wp.script("translate.py") +
        " --model {input.model} --input-text {input.mono} --output {output.corpus}"

wp.track(rules.translate_mono)
