"""The pipeline's own Python module, imported by its Snakefile."""


def shout(text: str) -> str:
    return text.upper()
