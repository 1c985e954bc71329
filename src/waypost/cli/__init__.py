"""The ``waypost`` commands (top layer): parsing, one module per group of
subcommands (``main`` is the entry point), and the pages they write (``findpage``, ``statuspage``, whose
JavaScript and CSS are package data in ``pages/``). A command asks the
layers below for facts and renders them; it decides nothing itself."""

