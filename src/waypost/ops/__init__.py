"""What the commands do to many stages at once: plan a run, find stages
(``catalog``), steer, prune, and the cron pass that drives a pipeline."""
