"""`python manage.py start`: everything a fresh machine needs, then the embedded server."""

from __future__ import annotations

import os
import secrets
import time
from types import SimpleNamespace

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from registry import samples, services
from registry.audit import Actor
from registry.models import ModelVersion, RegisteredModel, VersionStatus
from registry.store.artifacts import default_store
from registry.tasks import recover_validations
from registry.validation import validate_version
from serving.cli import add_grpc_arguments, use_grpc_arguments
from serving.core.extras import MissingExtra
from serving.process.replica_address import advertised_url

VALIDATING = (VersionStatus.UPLOADED, VersionStatus.VALIDATING)


class Command(BaseCommand):
    help = "Migrate, create an admin and a demo model if missing, then serve on 127.0.0.1:8000."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--no-demo", action="store_true")
        parser.add_argument("--no-serve", action="store_true", help="prepare only")
        add_grpc_arguments(parser)

    def handle(self, *args, host, port, no_demo, no_serve, **options):
        if not no_serve:  # before the app is built; gRPC without its extra stops here, first
            try:
                use_grpc_arguments(SimpleNamespace(host=host, **options))
            except MissingExtra as exc:
                raise CommandError(str(exc)) from None
        call_command("migrate", interactive=False, verbosity=0)
        services.ensure_roles()
        self._admin()
        if not no_demo:
            self._demo()
        recover_validations()
        if no_serve:
            return
        # The embedded replica advertises this server's URL: load tests (a job of this process
        # when embedded) reach it there. On every interface, loopback is this process.
        os.environ["MMC_REPLICA_ADDRESS"] = advertised_url(
            os.environ.get("MMC_REPLICA_ADDRESS", ""), host=host, port=port,
            wildcard_host="" if settings.CLUSTERED else "127.0.0.1")
        from console import asgi
        from serving.cli import serve

        self.stdout.write(f"Console and serving on http://{host}:{port}/  "
                          f"(v2 inference under /v2, API docs at /api/docs/)")
        if os.environ.get("MMC_GRPC_PORT"):
            self.stdout.write(f"gRPC inference (KServe v2) on "
                              f"{os.environ['MMC_GRPC_HOST']}:{os.environ['MMC_GRPC_PORT']}")
        # SIGTERM drains the data plane (not ready, Connection: close, then stop) as mmc-serve
        # MMC_LOG_FORMAT=json: uvicorn's own lines go through Django's JSON handler too
        own_logs = {"log_config": None} if settings.LOG_FORMAT == "json" else {}
        serve(asgi.application, serving=asgi.serving_app, host=host, port=port, loop="uvloop",
              http="serving.http.protocol:GuardedHttpToolsProtocol", access_log=False,
              lifespan="on", **own_logs)

    def _admin(self) -> None:
        User = get_user_model()
        if User.objects.filter(is_superuser=True).exists():
            return
        password = secrets.token_urlsafe(12)
        user = User.objects.create_superuser("admin", "", password)
        user.groups.add(Group.objects.get(name="admin"))
        self.stdout.write(self.style.WARNING(
            f"Created user 'admin' with password {password}  (shown once: change it in /admin/)"))

    def _demo(self) -> None:
        if RegisteredModel.objects.exists():
            return
        actor = Actor.system("start")
        services.model_create(name="demo-mlp", actor=actor, tags=["demo"],
                              description="A 64 -> 256 -> 256 -> 10 MLP built with onnx.helper")
        blob = default_store().save_bytes(samples.mlp())
        with transaction.atomic():
            version, _ = services.version_upload(model_name="demo-mlp", blob=blob, actor=actor,
                                                 filename="demo-mlp.onnx",
                                                 metadata={"source": "registry.samples.mlp"})
        # before serving starts, so the demo is deployable now: here, unless the worker its
        # upload queued got to it first (then wait for that one)
        validate_version(version.pk)
        deadline = time.monotonic() + 300
        while ModelVersion.objects.get(pk=version.pk).status in VALIDATING:
            if time.monotonic() > deadline:
                raise CommandError("the demo model did not finish validating in 300 s")
            time.sleep(0.1)
        services.endpoint_deploy(model_name="demo-mlp", version_number=version.number,
                                 actor=actor, reason="demo")
        self.stdout.write("Registered and deployed demo model 'demo-mlp' version 1.")
