"""The optional extras (pyproject's `[grpc]`, `[s3]`, `[fast-json]`) and the one message a feature
switched on without its extra stops with, at start-up rather than as a traceback in a request:

    gRPC is on (MMC_GRPC_PORT=9001) but grpcio is not installed: pip install 'mmc[grpc]'
"""

from __future__ import annotations

import importlib.util

#: extra -> (top-level module, the distribution that ships it), checked in this order
EXTRAS: dict[str, tuple[tuple[str, str], ...]] = {
    "grpc": (
        ("grpc", "grpcio"),
        ("grpc_health", "grpcio-health-checking"),
        ("grpc_reflection", "grpcio-reflection"),
        ("tritonclient", "tritonclient[grpc]"),
        ("hpack", "hpack"),
    ),
    "s3": (("boto3", "boto3"), ("botocore", "botocore")),
    "fast-json": (("simdjson", "pysimdjson"),),
}


class MissingExtra(RuntimeError):
    """A feature is switched on but a package of its extra is not installed."""

    def __init__(self, feature: str, extra: str, problem: str) -> None:
        self.feature, self.extra = feature, extra
        super().__init__(f"{feature} but {problem}: pip install 'mmc[{extra}]'")


def missing(extra: str) -> str | None:
    """What is missing of `extra` ("grpcio is not installed"), or None. Looks the modules up
    without importing them: a supervisor of several workers checks too, and serves nothing."""
    for module, distribution in EXTRAS[extra]:
        try:
            found = importlib.util.find_spec(module) is not None
        except ImportError:  # an import hook that refuses it: as good as absent
            found = False
        if not found:
            return f"{distribution} is not installed"
    return None


def require(extra: str, *, feature: str) -> None:
    """Raise MissingExtra unless `extra` is installed; `feature` says what switched it on, e.g.
    "gRPC is on (MMC_GRPC_PORT=9001)"."""
    problem = missing(extra)
    if problem is not None:
        raise MissingExtra(feature, extra, problem)
