"""The HTML pages' own stylesheets and scripts (``find --html``, ``status --html``).

Kept as files here, shipped as package data, so an editor and a linter see
CSS and JavaScript; each page inlines them, staying one self-contained file.
"""

from __future__ import annotations

from importlib import resources


def text(name: str) -> str:
    """The asset ``name`` (``find.js``) exactly as written: read as bytes so
    no newline is translated and the page renders byte for byte the same."""
    return (resources.files(__name__) / name).read_bytes().decode("utf-8")
