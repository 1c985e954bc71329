"""What waypost knows, with no store or scheduler behind it (bottom layer):
the states, the records and the manifest's schema, the stage directory's
layout, the step spec, policies and their conditions, the config and the
worker classes. Modules here import only each other (and the standard
library or a parser); everything above asks them."""
