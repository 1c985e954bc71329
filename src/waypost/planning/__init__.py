"""From a Snakefile and a config to the jobs to run: the stage graph, the
fan-out over datasets and points, which stages are done, held or reused, and
the rules' wiring to the step runner (``wiring``, the one package that
touches Snakemake's objects)."""
