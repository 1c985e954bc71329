# Student: trained on the distilled corpus, then every model is evaluated and
# the student exported.

rule train_student:
    input:
        distilled=wp.stage("translate_corpus", "distilled.tsv"),
        synthetic=wp.stage("translate_mono", "backtranslated.tsv"),
        vocab=wp.stage("train_vocab", "vocab.json"),
    output:
        model=wp.out("model.json"),
    resources:
        worker="gpu-large",
    params:
        epochs=wp.setting("epochs"),
        seed=wp.setting("seed", 0),
        subsample=wp.setting("subsample", 1.0),
    shell:
        wp.script("../scripts/train_model.py") + " --corpus {input.distilled} --corpus {input.synthetic} --direction src-trg"
        " --vocab {input.vocab} --epochs {params.epochs} --seed {params.seed} --subsample {params.subsample}"
        " --checkpoint-dir $WAYPOST_STAGE_DIR/checkpoints --output {output.model}"


def evaluated_models(experiment):
    """The evaluate instances of an experiment: every model it trains."""
    return ["backward"] + [f"teacher-{i}" for i in teachers(experiment)] + ["student"]


def model_of(wildcards):
    """The model an evaluate instance scores."""
    name, where = wildcards.instance, (wildcards.experiment, wildcards.pair)
    if name in ("backward", "student"):
        return wp.path_of(f"train_{name}", "model.json", *where)
    return wp.path_of("train_teacher", "model.json", *where, instance=name.removeprefix("teacher-"))


rule evaluate:
    input:
        model=wp.stage(("train_backward", "train_teacher", "train_student"), model_of),
        test=wp.stage("fetch_corpus", "test.tsv"),
    output:
        metrics=wp.out("metrics.json", instances=evaluated_models),
    resources:
        worker="gpu",
    wildcard_constraints:
        instance=r"backward|student|teacher-\d+",
    shell:
        wp.script("../scripts/evaluate.py") + " --model {input.model} --test {input.test} --output {output.metrics}"
        " --hypotheses $WAYPOST_STAGE_DIR/hypotheses.txt"


rule export:
    input:
        model=wp.stage("train_student", "model.json"),
        vocab=wp.stage("train_vocab", "vocab.json"),
        metrics=wp.stage("evaluate", "metrics.json", instance="student"),
    output:
        package=wp.out("package.tar.gz"),
    shell:
        wp.script("../scripts/export.py") + " --model {input.model} --vocab {input.vocab} --metrics {input.metrics}"
        " --output {output.package}"
