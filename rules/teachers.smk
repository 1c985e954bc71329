# Teachers: an ensemble of N models (N = `teachers` of the experiment), each
# its own stage instance, then distillation: the ensemble translates the corpus.

def teachers(experiment):
    """The ensemble size of an experiment."""
    return config["experiments"][experiment]["teachers"]


def teacher_models(wildcards):
    return [wp.path("train_teacher", "model.json", str(i)).format(pair=wildcards.pair, experiment=wildcards.experiment)
            for i in range(teachers(wildcards.experiment))]


rule train_teacher:
    input:
        unpack(wp.needs("train_teacher",
                   corpus=("clean_corpus", "clean.tsv"),
                   synthetic=("translate_mono", "backtranslated.tsv"),
                   vocab=("train_vocab", "vocab.json"))),
    output:
        model=wp.path("train_teacher", "model.json", INSTANCE),
    resources:
        **wp.resources("train_teacher", "gpu-large"),
    params:
        step=wp.step("train_teacher"),
        epochs=wp.setting("train_teacher", "epochs"),
        # Each member gets its own seed, so the ensemble members differ.
        seed=lambda wc: wp.settings(wc.experiment, wc.pair, "train_teacher").get("seed", 0) + int(wc.instance),
        subsample=wp.setting("train_teacher", "subsample", 1.0),
        checkpoints=lambda wc, output: os.path.join(os.path.dirname(output.model), "checkpoints"),
    wildcard_constraints:
        instance=r"\d+",
    shell:
        wp.run + wp.script("train_model.py") +
        " --corpus {input.corpus} --corpus {input.synthetic} --direction src-trg --vocab {input.vocab}"
        " --epochs {params.epochs} --seed {params.seed} --subsample {params.subsample}"
        " --checkpoint-dir {params.checkpoints} --output {output.model}"

wp.track(rules.train_teacher, instances=lambda e: [str(i) for i in range(teachers(e))])


rule translate_corpus:
    input:
        unpack(wp.needs("translate_corpus", models=("train_teacher", teacher_models), corpus=("clean_corpus", "clean.tsv"))),
    output:
        corpus=wp.path("translate_corpus", "distilled.tsv"),
    resources:
        **wp.resources("translate_corpus", "gpu"),
    params:
        step=wp.step("translate_corpus"),
        models=lambda wc, input: " ".join(f"--model {m}" for m in input.models),
    shell:
        wp.run + wp.script("translate.py") +
        " {params.models} --input-tsv {input.corpus} --column src --output {output.corpus}"

wp.track(rules.translate_corpus)
