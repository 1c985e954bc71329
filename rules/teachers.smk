# Teachers: an ensemble of N models (N = `teachers` of the experiment), each
# its own stage instance, then distillation: the ensemble translates the corpus.

def teachers(experiment):
    """The ensemble members of an experiment: 0 … teachers-1."""
    return [str(i) for i in range(config["experiments"][experiment]["teachers"])]


rule train_teacher:
    input:
        corpus=wp.stage("clean_corpus", "clean.tsv"),
        synthetic=wp.stage("translate_mono", "backtranslated.tsv"),
        vocab=wp.stage("train_vocab", "vocab.json"),
    output:
        model=wp.out("model.json", instances=teachers),
    resources:
        worker="gpu-large",
    params:
        epochs=wp.setting("epochs"),
        seed=wp.setting("seed", 0),
        subsample=wp.setting("subsample", 1.0),
    wildcard_constraints:
        instance=r"\d+",
    shell:
        wp.script("../scripts/train_model.py") + " --corpus {input.corpus} --corpus {input.synthetic} --direction src-trg"
        " --vocab {input.vocab} --epochs {params.epochs} --subsample {params.subsample}"
        # each member its own seed, so the ensemble members differ
        " --seed $(({params.seed} + {wildcards.instance}))"
        " --checkpoint-dir $WAYPOST_STAGE_DIR/checkpoints --output {output.model}"


rule translate_corpus:
    input:
        models=wp.each("train_teacher", "model.json"),
        corpus=wp.stage("clean_corpus", "clean.tsv"),
    output:
        corpus=wp.out("distilled.tsv"),
    resources:
        worker="gpu",
    params:
        models=lambda wc, input: " ".join(f"--model {m}" for m in input.models),
    shell:
        wp.script("../scripts/translate.py") + " {params.models} --input-tsv {input.corpus} --column src"
        " --output {output.corpus}"
