"""`mmc-serve`: one serving replica on uvicorn (uvloop + httptools, no access log).

    mmc-serve --model-repository DIR [--host 127.0.0.1] [--port 8001] [--replica r1]
    mmc-serve --registry            (follow the registry's desired state; needs Django settings)
"""

from __future__ import annotations

import argparse
import os
import socket

_ENV_REPO = "MMC_SERVE_MODEL_REPOSITORY"
_ENV_REGISTRY = "MMC_SERVE_REGISTRY"
_ENV_REPLICA = "MMC_SERVE_REPLICA"
_PROTOCOL = "serving.protocol:GuardedHttpToolsProtocol"


def _source(repository: str | None, registry: bool):
    if registry:
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
        import django

        django.setup()
        from registry.serving_source import RegistrySource

        return RegistrySource()
    from registry.signatures import read_signature
    from serving.sources import RepositorySource

    return RepositorySource(repository, read_signature=read_signature)


def app_from_env():
    """App factory for uvicorn workers (--workers > 1 re-imports the app in each process)."""
    from serving.app import create_app

    source = _source(os.environ.get(_ENV_REPO), os.environ.get(_ENV_REGISTRY) == "1")
    replica = os.environ.get(_ENV_REPLICA) or socket.gethostname()
    if os.environ.get("MMC_SERVE_WORKERS", "1") != "1":
        replica = f"{replica}-{os.getpid()}"
    return create_app(source, replica=replica)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="mmc-serve", description=__doc__.split("\n")[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--model-repository", metavar="DIR",
                       help="Triton-like folder: <model>/<version>/model.onnx [+ config.json]")
    where.add_argument("--registry", action="store_true",
                       help="follow the registry (Django settings from the environment)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--replica", default=None, help="replica id (default: the host name)")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)

    import uvicorn

    if args.model_repository and not os.path.isdir(args.model_repository):
        parser.error(f"--model-repository {args.model_repository}: not a directory")
    os.environ[_ENV_REPLICA] = args.replica or socket.gethostname()
    os.environ["MMC_SERVE_WORKERS"] = str(args.workers)
    if args.registry:
        os.environ[_ENV_REGISTRY] = "1"
    else:
        os.environ[_ENV_REPO] = os.path.abspath(args.model_repository)
    # httptools plus header timeout, header size and connection caps (serving.protocol)
    options = dict(host=args.host, port=args.port, loop="uvloop", http=_PROTOCOL,
                   lifespan="on", access_log=False, log_level=args.log_level,
                   timeout_graceful_shutdown=5)
    if args.workers > 1:
        uvicorn.run("serving.cli:app_from_env", factory=True, workers=args.workers, **options)
    else:
        uvicorn.run(app_from_env(), **options)


if __name__ == "__main__":
    main()
