"""`mmc`: the command line for CI (registry.cli.main)."""

from registry.cli.main import main

__all__ = ["main"]
