"""waypost: a file-state workflow engine for training pipelines and parameter
studies, built on Snakemake."""

__version__ = "0.1.0"
