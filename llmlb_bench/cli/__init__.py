"""Command-line interface: ``llmlb`` (also ``python -m llmlb_bench``)."""

from llmlb_bench.cli.app import app, main

__all__ = ["app", "main"]
