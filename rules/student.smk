# Student: trained on the distilled corpus, then every model is evaluated and
# the student exported.

rule train_student:
    input:
        unpack(wp.needs("train_student",
                   distilled=("translate_corpus", "distilled.tsv"),
                   synthetic=("translate_mono", "backtranslated.tsv"),
                   vocab=("train_vocab", "vocab.json"))),
    output:
        model=wp.path("train_student", "model.json"),
    resources:
        **wp.resources("train_student", "gpu-large"),
    params:
        step=wp.step("train_student"),
        epochs=wp.setting("train_student", "epochs"),
        seed=wp.setting("train_student", "seed", 0),
        subsample=wp.setting("train_student", "subsample", 1.0),
        checkpoints=lambda wc, output: os.path.join(os.path.dirname(output.model), "checkpoints"),
    shell:
        wp.run + wp.script("train_model.py") +
        " --corpus {input.distilled} --corpus {input.synthetic} --direction src-trg --vocab {input.vocab}"
        " --epochs {params.epochs} --seed {params.seed} --subsample {params.subsample}"
        " --checkpoint-dir {params.checkpoints} --output {output.model}"

wp.track(rules.train_student)


def evaluated_models(experiment):
    """The evaluate instances of an experiment: every model it trains."""
    return ["backward"] + [f"teacher-{i}" for i in range(teachers(experiment))] + ["student"]


def model_of(wildcards):
    name = wildcards.instance
    if name == "backward":
        path = wp.path("train_backward", "model.json")
    elif name == "student":
        path = wp.path("train_student", "model.json")
    else:
        path = wp.path("train_teacher", "model.json", name.removeprefix("teacher-"))
    return path.format(pair=wildcards.pair, experiment=wildcards.experiment)


rule evaluate:
    input:
        unpack(wp.needs("evaluate", model=(("train_backward", "train_teacher", "train_student"), model_of), test=("fetch_corpus", "test.tsv"))),
    output:
        metrics=wp.path("evaluate", "metrics.json", INSTANCE),
    resources:
        **wp.resources("evaluate", "gpu"),
    params:
        step=wp.step("evaluate"),
        hypotheses=lambda wc, output: os.path.join(os.path.dirname(output.metrics), "hypotheses.txt"),
    wildcard_constraints:
        instance=r"backward|student|teacher-\d+",
    shell:
        wp.run + wp.script("evaluate.py") +
        " --model {input.model} --test {input.test} --output {output.metrics}"
        " --hypotheses {params.hypotheses}"

wp.track(rules.evaluate, instances=evaluated_models)


rule export:
    input:
        unpack(wp.needs("export",
                   model=("train_student", "model.json"),
                   vocab=("train_vocab", "vocab.json"),
                   metrics=("evaluate", "metrics.json", "student"))),
    output:
        package=wp.path("export", "package.tar.gz"),
    resources:
        **wp.resources("export", "cpu"),
    params:
        step=wp.step("export"),
    shell:
        wp.run + wp.script("export.py") +
        " --model {input.model} --vocab {input.vocab} --metrics {input.metrics} --output {output.package}"

wp.track(rules.export)
