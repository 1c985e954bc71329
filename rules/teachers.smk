# Teachers: an ensemble of N models (N = `teachers` of the experiment), each
# its own stage instance, then distillation: the ensemble translates the corpus.

def teacher_models(wildcards):
    return [wp.mark(wp.path("train_teacher", "model.json", str(i)).format(
                pair=wildcards.pair, experiment=wildcards.experiment))
            for i in range(wp.teachers(wildcards.experiment))]


rule train_teacher:
    input:
        corpus=wp.input("clean_corpus", "clean.tsv"),
        synthetic=wp.input("translate_mono", "backtranslated.tsv"),
        vocab=wp.input("train_vocab", "vocab.json"),
    output:
        model=wp.path("train_teacher", "model.json", INSTANCE),
    params:
        step=wp.step("train_teacher"),
        epochs=wp.setting("train_teacher", "epochs"),
        # Each member gets its own seed, so the ensemble members differ.
        seed=lambda wc: wp.settings(wc.experiment, wc.pair, "train_teacher").get("seed", 0) + int(wc.instance),
        subsample=lambda wc: wp.settings(wc.experiment, wc.pair, "train_teacher").get("subsample", 1.0),
        checkpoints=lambda wc, output: os.path.join(os.path.dirname(output.model), "checkpoints"),
    wildcard_constraints:
        instance=r"\d+",
    shell:
        "{params.step} " + wp.script("train_model.py") +
        " --corpus {input.corpus} --corpus {input.synthetic} --direction src-trg --vocab {input.vocab}"
        " --epochs {params.epochs} --seed {params.seed} --subsample {params.subsample}"
        " --checkpoint-dir {params.checkpoints} --output {output.model}"


rule translate_corpus:
    input:
        models=teacher_models,
        corpus=wp.input("clean_corpus", "clean.tsv"),
    output:
        corpus=wp.path("translate_corpus", "distilled.tsv"),
    params:
        step=wp.step("translate_corpus"),
        models=lambda wc, input: " ".join(f"--model {m}" for m in input.models),
    shell:
        "{params.step} " + wp.script("translate.py") +
        " {params.models} --input-tsv {input.corpus} --column src --output {output.corpus}"
