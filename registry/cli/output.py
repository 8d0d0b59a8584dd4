"""What the CLI prints besides its tables: JSON on stdout, and its one error type, printed on
stderr as `mmc: <message>` (the client's refusals, mmc.MmcError, are printed the same way)."""

from __future__ import annotations

import json
from typing import Any


class CliError(Exception):
    pass


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str))
