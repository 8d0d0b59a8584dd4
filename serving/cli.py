"""`mmc-serve`: one serving replica on uvicorn (uvloop + httptools, no access log).

    mmc-serve --model-repository DIR [--host 127.0.0.1] [--port 8001] [--replica r1]
    mmc-serve --registry URL        (follow the control plane at URL over HTTP, with the replica
                                     credential in $MMC_REPLICA_TOKEN or --replica-token-file;
                                     no database settings)
    mmc-serve --registry            (follow the registry's database directly; Django settings)
    ... --grpc-port 9001            (also the KServe v2 / Triton gRPC front, same process)
"""

from __future__ import annotations

import argparse
import os
import socket
import sys

from serving.core.extras import MissingExtra, require
from serving.edge_limits import EdgeLimits
from serving.process import supervisor
from serving.process.replica_address import advertised_url

_ENV_REPO = "MMC_SERVE_MODEL_REPOSITORY"
_ENV_REGISTRY = "MMC_SERVE_REGISTRY"
_ENV_TOKEN = "MMC_REPLICA_TOKEN"
_ENV_REPLICA = "MMC_SERVE_REPLICA"
_PROTOCOL = "serving.http.protocol:GuardedHttpToolsProtocol"


def _source(repository: str | None, registry: str):
    """The desired-state source: the control plane over HTTP (`registry` a URL), the registry's
    database (`registry` "1"), or a model repository folder."""
    if registry.startswith(("http://", "https://")):
        from serving.sources.control_plane import HttpRegistrySource

        return HttpRegistrySource(
            registry, _replica_token(), address=os.environ.get("MMC_REPLICA_ADDRESS", ""),
            cache_dir=os.environ.get("MMC_REPLICA_CACHE_DIR") or None)
    if registry:
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
        import django

        django.setup()
        from registry.serving_source import RegistrySource

        return RegistrySource(address=os.environ.get("MMC_REPLICA_ADDRESS", ""))
    from registry.signatures import read_signature
    from serving.sources.repository import RepositorySource

    return RepositorySource(repository, read_signature=read_signature)


def _replica_token() -> str:
    return os.environ.get(_ENV_TOKEN, "").strip()


def serve(app, **options) -> None:
    """Run the ASGI `app` on uvicorn with the drain on SIGTERM (serving.http.server.serve):
    imported here only when this process serves, so a supervisor of several workers loads
    neither uvicorn nor the app."""
    from serving.http.server import serve as run

    run(app, **options)


def add_grpc_arguments(parser) -> None:
    """--grpc-port / --grpc-host, for every command that serves the data plane."""
    parser.add_argument("--grpc-port", type=int, default=None,
                        help="also serve the KServe v2 gRPC API (GRPCInferenceService, health, "
                             "reflection) on this port; default: off ($MMC_GRPC_PORT)")
    parser.add_argument("--grpc-host", default=None,
                        help="address the gRPC front listens on (default: --host)")


def use_grpc_arguments(args) -> None:
    """Hand the gRPC flags to ServingSettings.from_env (the app is built from the environment,
    also in uvicorn's worker processes). MissingExtra when gRPC is on without the [grpc] extra."""
    if args.grpc_port is not None:
        os.environ["MMC_GRPC_PORT"] = str(args.grpc_port)
    port = os.environ.get("MMC_GRPC_PORT")
    if args.grpc_host or port:
        os.environ["MMC_GRPC_HOST"] = args.grpc_host or args.host
    if port:
        said = f"--grpc-port {port}" if args.grpc_port is not None else f"MMC_GRPC_PORT={port}"
        require("grpc", feature=f"gRPC is on ({said})")


def _one_worker_for_shared_memory(asked: str, workers: int) -> int:
    """Shared-memory regions are registered with one process, so a server that offers them
    (MMC_SHM=on) runs one worker: `auto` gives one, a larger number is refused."""
    if workers == 1 or not EdgeLimits.from_env().shared_memory:
        return workers
    if asked.strip().lower() == "auto":
        return 1
    raise ValueError(f"--workers {asked}: with MMC_SHM=on the server runs one worker (a "
                     "shared-memory region is registered with one process, and the others "
                     "would not know it); use --workers 1 or turn MMC_SHM off")


def use_observability(env, log_level: str) -> None:
    """The process's logging (MMC_LOG_FORMAT: text or json, at `log_level`) and a check of
    tracing's packages when OTEL_* turns it on (MissingExtra without them, ValueError for a
    value not offered), before anything serves."""
    from serving.core import logs, tracing

    exporter = tracing.exporter_from_env(env)
    if exporter is not None:
        tracing.require_packages(exporter)
    logs.configure(line=logs.line_format(env), level=log_level)


def app_from_env():
    """The app as the environment describes it (main() writes it; a supervised worker reads
    what its supervisor's main() wrote). Worker i of several reports as replica `<id>-w<i>`:
    stable across the worker's restarts, so its successor takes over its row."""
    from serving.http.app import create_app

    source = _source(os.environ.get(_ENV_REPO), os.environ.get(_ENV_REGISTRY, ""))
    replica = os.environ.get(_ENV_REPLICA) or socket.gethostname()
    index = os.environ.get(supervisor.ENV_WORKER_INDEX)
    if index is not None:
        replica = f"{replica}-w{index}"
    return create_app(source, replica=replica)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="mmc-serve", description=__doc__.split("\n")[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--model-repository", metavar="DIR",
                       help="Triton-like folder: <model>/<version>/model.onnx [+ config.json]")
    where.add_argument("--registry", nargs="?", const="1", metavar="URL",
                       help="follow the control plane at URL (http[s]://…) with a replica "
                            "credential; without URL, read the registry's database (Django "
                            "settings from the environment)")
    parser.add_argument("--replica-token-file", metavar="PATH",
                        help="file holding the replica credential (default: "
                             "$MMC_REPLICA_TOKEN)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--replica", default=None, help="replica id (default: the host name)")
    parser.add_argument(
        "--workers", default=os.environ.get(supervisor.ENV_WORKERS) or "auto",
        help="serving processes on the one port, each with its own copy of every model: a "
             "number, or 'auto' (default, $MMC_SERVE_WORKERS): one per usable CPU, at most "
             f"{supervisor.AUTO_MAX_WORKERS}, one on a GPU host")
    parser.add_argument("--log-level", default="warning")
    add_grpc_arguments(parser)
    args = parser.parse_args(argv)

    if args.model_repository and not os.path.isdir(args.model_repository):
        parser.error(f"--model-repository {args.model_repository}: not a directory")
    try:
        workers = supervisor.resolve_workers(args.workers)
        workers = _one_worker_for_shared_memory(args.workers, workers)
    except ValueError as exc:
        parser.error(str(exc))
    os.environ[_ENV_REPLICA] = args.replica or socket.gethostname()
    try:
        use_grpc_arguments(args)
        use_observability(os.environ, args.log_level)
    except MissingExtra as exc:
        parser.exit(2, f"{parser.prog}: {exc}\n")
    except ValueError as exc:
        parser.error(str(exc))
    if args.registry:
        if args.registry != "1" and not args.registry.startswith(("http://", "https://")):
            parser.error(f"--registry {args.registry}: give the control plane's http(s) URL")
        if args.replica_token_file:
            try:
                os.environ[_ENV_TOKEN] = open(args.replica_token_file).read().strip()
            except OSError as exc:
                parser.error(f"--replica-token-file: {exc}")
        if args.registry != "1" and not os.environ.get(_ENV_TOKEN):
            parser.error("--registry URL needs the replica credential: $MMC_REPLICA_TOKEN or "
                         "--replica-token-file (an admin makes one on the console's Replicas "
                         "page)")
        os.environ[_ENV_REGISTRY] = args.registry
        # the URL its heartbeats advertise (where a load test reaches it), complete
        os.environ["MMC_REPLICA_ADDRESS"] = advertised_url(
            os.environ.get("MMC_REPLICA_ADDRESS", ""), host=args.host, port=args.port)
    else:
        os.environ[_ENV_REPO] = os.path.abspath(args.model_repository)
    # httptools plus header timeout, header size and connection caps (serving.http.protocol)
    # uvicorn's loggers write through the process's handler (use_observability), at the
    # levels the logging extension sets: uvicorn configures none of its own
    options = dict(host=args.host, port=args.port, loop="uvloop", http=_PROTOCOL,
                   lifespan="on", access_log=False, log_config=None, log_level=None,
                   timeout_graceful_shutdown=5)
    if workers > 1:
        # Each worker: this same command as one process on the supervisor's socket.
        command = [sys.executable, "-m", "serving.cli", *(argv if argv is not None
                                                           else sys.argv[1:]), "--workers", "1"]
        drain = float(os.environ.get("MMC_DRAIN_SECONDS") or supervisor.DEFAULT_DRAIN_SECONDS)
        raise SystemExit(supervisor.run_workers(
            command, workers, host=args.host, port=args.port,
            stop_timeout=drain + options["timeout_graceful_shutdown"] + 15))
    sockets, held = None, False
    if supervisor.is_worker():  # one of several: its own socket on the shared port
        if supervisor.supervisor_gone():
            raise SystemExit(0)  # it died before this worker got here: nobody to serve for
        # started again while the others serve: it opens its socket once it can answer
        held = supervisor.is_restart()
        if not held:
            sockets = [supervisor.reuse_port_listener(args.host, args.port)]
    serve(app_from_env(), sockets=sockets, held=held, **options)


if __name__ == "__main__":
    main()
