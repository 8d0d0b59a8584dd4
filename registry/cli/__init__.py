"""`mmc`: the command line for CI (registry.cli.main), built on the Python client (mmc); where it
finds its server and token is the client's too (mmc.config)."""

from mmc import config
from registry.cli.main import main

__all__ = ["config", "main"]
