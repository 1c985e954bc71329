# Report: one per experiment, a table of BLEU and chrF per pair and model.

def report_entries(experiment):
    """(pair, model) of every evaluation in the experiment, in a fixed order."""
    return [(pair, model) for pair in wp.pairs(experiment) for model in evaluated_models(experiment)]


rule report:
    input:
        unpack(wp.needs("report", metrics=("evaluate", lambda wc: [
            wp.path("evaluate", "metrics.json", model, pair=pair).format(experiment=wc.experiment)
            for pair, model in report_entries(wc.experiment)]))),
    output:
        markdown=wp.funnel_path("report", "report.md"),
        html=wp.funnel_path("report", "report.html"),
    resources:
        **wp.resources("report", "cpu"),
    params:
        step=wp.step("report"),
        entries=lambda wc, input: " ".join(
            f"--entry {pair} {model} {path}" for (pair, model), path in zip(report_entries(wc.experiment), input.metrics)),
    shell:
        wp.run + wp.script("report.py") +
        " --experiment {wildcards.experiment} {params.entries}"
        " --output-md {output.markdown} --output-html {output.html}"

wp.track(rules.report)
