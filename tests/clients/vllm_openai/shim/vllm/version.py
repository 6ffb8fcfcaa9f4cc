"""Shim: the vLLM version these tests come from (sources.json)."""

__version__ = "0.32.0"


def _prev_minor_version() -> str:
    return "0.31"
