"""The step runner: what runs inside a stage job, around the user's command
(``main``: ``python -m waypost.runner``). A ``StageRun`` holds the stage
directory for one series of attempts (``stagerun``, ``stagedir``), each
attempt runs the command under its limits (``stageattempt``, ``attempt``),
and ``series`` decides what comes next from the policy's cues."""
