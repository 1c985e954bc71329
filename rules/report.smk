# Report: one per experiment, a table of BLEU and chrF per pair and model.

rule report:
    input:
        metrics=wp.each("evaluate", "metrics.json"),
    output:
        markdown=wp.out("report.md", funnel=True),
        html=wp.out("report.html"),
    params:
        # (pair, model) of each metrics file, in wp.each's order: pairs, then instances
        entries=lambda wc, input: " ".join(
            f"--entry {path.split('/')[-5]} {path.split('/')[-2]} {path}" for path in input.metrics),
    shell:
        wp.script("../scripts/report.py") + " --experiment {wildcards.experiment} {params.entries}"
        " --output-md {output.markdown} --output-html {output.html}"
