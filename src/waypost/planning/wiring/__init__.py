"""The adapter between Snakemake and waypost: the one package of waypost
that touches Snakemake's objects (the workflow, its rules, their jobs, the
DAG, checkpoints, the scheduler).

- ``snake``: ``Snake``, what the planning asks of a Snakefile's workflow;
- ``rules``: how its rules become steps (``wire``, ``wire_own_layout``...);
- ``steps`` and ``runblocks``: the run functions that run a job's step,
  the local step server's hand-off, the command a submitted job runs;
- ``bucket``: the gs:// root's hand-off between Snakemake and the runner;
- ``triggers``: Snakemake's rerun triggers, a run's graceful stop;
- ``jobfiles``: a rule in its own layout's jobs' files, for the runner;
- ``internals``: every private part of Snakemake waypost touches, with
  the versions tested.
"""
