"""``waypost import``: a Maestro or Merlin study spec as a Snakefile and a
config that run it as written.

``maestro`` and ``merlin`` read their spec into one ``study.Study`` (steps,
parameters or samples, variables, labels); ``study`` works out which steps
run per point and what each reads, and ``emit`` writes the pipeline.
"""
