"""waypost: a file-state workflow engine for training pipelines and parameter
studies, built on Snakemake."""

__version__ = "0.1.0"


def with_site() -> None:
    """Installed packages on ``sys.path``, for a step runner started without
    ``site`` (``launch.py``: it saves each step ~3 ms) when it needs them (a
    bucket, a reuse, the records' schema check)."""
    import sys
    if not sys.flags.no_site:
        return
    import site
    site.main()
