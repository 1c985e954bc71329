"""What a stage directory holds now, read through a store: its lifecycle
(``lifecycle``, the one reader of a stage's state), the steps a killed runner
left (``leftovers``), the listing ``status`` shows, reuse of other
experiments' stages and checks of what a SUCCESS promises (``verify``)."""
