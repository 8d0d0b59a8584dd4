"""`mmc`: the registry from CI pipelines, over the REST API with a token.

    mmc login http://127.0.0.1:8000            # or, in CI: export MMC_URL=... MMC_TOKEN=mmc_...
    mmc whoami                                 # logout: revoke the token, forget it
    mmc create-model fraud --tag team:risk
    mmc upload fraud model.onnx --metadata '{"git_commit": "abc"}' --wait
    mmc versions fraud
    mmc alias fraud production 3
    mmc deploy fraud 3 --wait 30
    mmc canary fraud 4 --weight 5 --wait 30     # then: weight, promote, abort
    mmc canary fraud 4 --plan '{"steps": [5, 25, 50, 100], "bake_seconds": 300}'
    mmc rollback fraud 2 [--unload-first]      # bg-deploy, switch, switch-back, bg-finish
    mmc export fraud --versions 2,3 -o fraud-triton.tar.gz   # a Triton model repository
    mmc tensorrt fraud 3 --precision fp16      # build a TensorRT engine on a GPU worker
    mmc webhooks | webhook-add URL [--model m] [--event version.ready] | webhook-test ID
    mmc async-infer fraud request.json --wait 60 --out response.json
    mmc batch run fraud rows.npy --wait 600 --out scores.npy   # batch upload; job ID [--cancel]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import httpx

from registry.cli import config
from registry.cli.account import account_parsers
from registry.cli.client import Client, CliError, print_json
from registry.cli.jobs import job_parsers


def _wait_validated(client: Client, model: str, number: int, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        version = client.call("GET", f"models/{model}/versions/{number}/")
        if version["status"] not in ("uploaded", "validating"):
            return version
        if time.monotonic() > deadline:
            raise CliError(f"{model}:{number} still {version['status']} after {timeout:.0f}s")
        time.sleep(0.5)


def cmd_models(c: Client, a) -> int:
    params = {k: v for k, v in (("search", a.search), ("tag", a.tag)) if v}
    for m in c.call("GET", "models/", params=params)["results"]:
        print(f"{m['name']:30} versions={m['version_count']:<4} stable={m['stable_version']}  "
              f"tags={','.join(m['tags'])}")
    return 0


def cmd_create_model(c: Client, a) -> int:
    print_json(c.call("POST", "models/", json={"name": a.name, "description": a.description,
                                           "tags": a.tag or []}))
    return 0


def cmd_upload(c: Client, a) -> int:
    path = Path(a.file)
    if not path.is_file():
        raise CliError(f"{path} is not a file")
    params = {"filename": path.name}
    if a.metadata:
        json.loads(a.metadata)  # fail here, not on the server, on bad JSON
        params["metadata"] = a.metadata
    with path.open("rb") as f:
        version = c.call("PUT", f"models/{a.model}/versions/upload/", params=params, content=f,
                         headers={"Content-Type": "application/octet-stream"})
    print(version.get("detail") or f"uploaded {a.model}:{version['number']} "
          f"(sha256 {version['sha256'][:12]}), status {version['status']}", file=sys.stderr)
    if a.wait:
        version = _wait_validated(c, a.model, version["number"], a.wait)
    print_json(version)
    return 0 if version["status"] != "failed" else 2


def cmd_versions(c: Client, a) -> int:
    print(f"{'#':>4}  {'STATUS':10} {'SHA256':12}  {'BYTES':>10}  ALIASES  FAILURE")
    for v in c.call("GET", f"models/{a.model}/versions/")["results"]:
        print(f"{v['number']:>4}  {v['status']:10} {v['sha256'][:12]}  {v['size_bytes']:>10}  "
              f"{','.join(v['aliases']) or '-':7}  {v['failure_reason'][:60]}")
    return 0


def cmd_alias(c: Client, a) -> int:
    if a.delete:
        c.call("DELETE", f"models/{a.model}/aliases/{a.alias}/")
    else:
        print_json(c.call("PUT", f"models/{a.model}/aliases/{a.alias}/",
                          json={"version": a.version}))
    return 0


def cmd_deploy(c: Client, a) -> int:
    params = {"wait": a.wait} if a.wait else {}
    body = c.call("POST", f"models/{a.model}/endpoint/deploy/", params=params,
                  json={"version": a.version, "reason": a.reason})
    print_json(body)
    conv = body.get("convergence")
    return 0 if conv is None or conv["converged"] else 3


ROLLOUT_OPS = {
    # command: (path under endpoint/, positional args, help)
    "canary": ("canary", ("version",), "route --weight %% of traffic to a ready candidate"),
    "weight": ("weight", ("weight",), "set the candidate's share (0-100)"),
    "promote": ("promote", (), "make the candidate stable (old stable stays warm)"),
    "abort": ("abort", (), "drop the candidate"),
    "pause": ("analysis/pause", (), "pause the automated canary analysis"),
    "resume": ("analysis/resume", (), "resume the automated canary analysis"),
    "rollback": ("rollback", ("version",), "point stable at an earlier ready version"),
    "bg-deploy": ("blue-green/deploy", ("version",), "load a version into the idle colour"),
    "switch": ("blue-green/switch", (), "send all traffic to the idle colour"),
    "switch-back": ("blue-green/switch-back", (), "send all traffic back"),
    "bg-finish": ("blue-green/finish", (), "leave blue-green; drop the idle colour"),
    "shadow": ("shadow", ("version",), "mirror traffic to a version (or --stop)"),
}


def cmd_rollout(c: Client, a) -> int:
    path, positional, _ = ROLLOUT_OPS[a.command]
    params = {"wait": a.wait} if a.wait else {}
    body = {"reason": a.reason, **{name: getattr(a, name) for name in positional}}
    if a.command == "canary":
        body.update(weight=a.weight, override=a.override)
        if a.plan:
            body["plan"] = json.loads(a.plan)
    if a.command == "rollback" and a.unload_first:
        body["order"] = "unload-first"
    if a.command == "shadow" and a.stop:
        result = c.call("DELETE", f"models/{a.model}/endpoint/shadow/",
                        params={**params, "reason": a.reason})
    else:
        result = c.call("POST", f"models/{a.model}/endpoint/{path}/", params=params, json=body)
    print_json(result)
    conv = result.get("convergence")
    return 0 if conv is None or conv["converged"] else 3


def cmd_export(c: Client, a) -> int:
    """Stream the archive to a temporary name, rename when complete: no half-written file."""
    out = Path(a.output)
    partial = out.with_name(out.name + ".part")
    params = {"format": a.format, "versions": a.versions or "all"}
    try:
        with c.http.stream("GET", f"models/{a.model}/export", params=params) as r:
            if r.status_code >= 400:
                r.read()
                try:
                    message = r.json().get("error", r.text)
                except ValueError:
                    message = r.text
                raise CliError(f"{r.status_code}: {message}")
            with partial.open("wb") as f:
                for chunk in r.iter_bytes():
                    f.write(chunk)
    except httpx.HTTPError as exc:
        partial.unlink(missing_ok=True)
        raise CliError(f"export failed: {exc}") from None
    partial.replace(out)
    print(f"wrote {out} (versions {r.headers.get('X-Exported-Versions', '?')}, "
          f"{out.stat().st_size} bytes)", file=sys.stderr)
    return 0


def cmd_tensorrt(c: Client, a) -> int:
    path = f"models/{a.model}/versions/{a.version}/tensorrt/"
    print_json(c.call("POST", path, json={"precision": a.precision})["validation_report"].get(
        "tensorrt"))
    return 0


def cmd_webhooks(c: Client, a) -> int:
    for h in c.call("GET", "webhooks/")["results"]:
        print(f"{h['id']:>4}  {'on ' if h['active'] else 'off'}  {h['model'] or '*':20} "
              f"{','.join(h['events']) or '*':30} {h['url']}")
    return 0


def cmd_webhook_add(c: Client, a) -> int:
    print_json(c.call("POST", "webhooks/", json={"url": a.url, "model": a.model, "name": a.name,
                                             "events": a.event or []}))
    return 0


def cmd_webhook_test(c: Client, a) -> int:
    delivery = c.call("POST", f"webhooks/{a.id}/test/")
    print_json(delivery)
    return 0 if delivery["status"] == "succeeded" else 2


def _integration_parsers(sub) -> None:
    s = sub.add_parser("export", help="download a Triton model repository (.tar.gz)")
    s.add_argument("model")
    s.add_argument("--versions", help="'all' (default: every ready version), 'stable' or 1,2")
    s.add_argument("--format", default="triton", choices=["triton"])
    s.add_argument("-o", "--output", required=True, help="the .tar.gz to write")
    s.set_defaults(fn=cmd_export)
    s = sub.add_parser("tensorrt", help="build a TensorRT engine for a version (GPU worker)")
    s.add_argument("model")
    s.add_argument("version", type=int)
    s.add_argument("--precision", default="fp16", choices=["fp32", "fp16"])
    s.set_defaults(fn=cmd_tensorrt)
    s = sub.add_parser("webhooks", help="list webhook subscriptions (admin)")
    s.set_defaults(fn=cmd_webhooks)
    s = sub.add_parser("webhook-add", help="subscribe a URL to lifecycle events (admin)")
    s.add_argument("url")
    s.add_argument("--model", help="only this model's events (default: every model)")
    s.add_argument("--event", action="append", help="repeat; default: every event")
    s.add_argument("--name", default="")
    s.set_defaults(fn=cmd_webhook_add)
    s = sub.add_parser("webhook-test", help="send a test event to a webhook now (admin)")
    s.add_argument("id", type=int)
    s.set_defaults(fn=cmd_webhook_test)


def _rollout_parsers(sub) -> None:
    for command, (_, positional, text) in ROLLOUT_OPS.items():
        s = sub.add_parser(command, help=text)
        s.add_argument("model")
        for name in positional:
            s.add_argument(name, type=int, nargs="?" if command == "shadow" else None)
        s.add_argument("--reason", default="")
        s.add_argument("--wait", type=float, default=0, help="seconds to wait for all replicas")
        if command == "canary":
            s.add_argument("--weight", type=int, default=0)
            s.add_argument("--plan", help='analysis plan JSON, e.g. \'{"steps": [5, 25, 100], '
                                          '"bake_seconds": 300}\'')
            s.add_argument("--override", action="store_true",
                           help="admin: start despite signature differences (needs --reason)")
        if command == "rollback":
            s.add_argument("--unload-first", action="store_true",
                           help="free memory first (unpinned requests get 503 in the gap)")
        if command == "shadow":
            s.add_argument("--stop", action="store_true")
        s.set_defaults(fn=cmd_rollout)


class CommandNamespace(argparse._SubParsersAction):
    """A sub-command's arguments land in a namespace of their own (`args.command`), never in the
    one holding --url and --token: no sub-command argument, today's or a future one, whatever
    its name (`webhook-add URL`, `--callback-url`), can change where the token is sent."""

    def __call__(self, parser, namespace, values, option_string=None):
        command = argparse.Namespace()
        super().__call__(parser, command, values, option_string)
        # argparse keeps what nobody recognised on the namespace it was given: hand it up, so
        # that a stray argument is still an error.
        extras = vars(command).pop(argparse._UNRECOGNIZED_ARGS_ATTR, None)
        if extras:
            vars(namespace).setdefault(argparse._UNRECOGNIZED_ARGS_ATTR, []).extend(extras)
        setattr(namespace, self.dest, command)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mmc", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", help="the console (default: MMC_URL, else the one `mmc login` "
                                 f"saved, else {config.DEFAULT_URL})")
    p.add_argument("--token", help="an API token (default: MMC_TOKEN, else the saved one)")
    sub = p.add_subparsers(dest="command", required=True, action=CommandNamespace,
                           metavar="COMMAND")
    account_parsers(sub)
    s = sub.add_parser("models", help="list models")
    s.add_argument("--search")
    s.add_argument("--tag")
    s.set_defaults(fn=cmd_models)
    s = sub.add_parser("create-model", help="register a model name")
    s.add_argument("name")
    s.add_argument("--description", default="")
    s.add_argument("--tag", action="append")
    s.set_defaults(fn=cmd_create_model)
    s = sub.add_parser("upload", help="upload an .onnx file as the next version")
    s.add_argument("model")
    s.add_argument("file")
    s.add_argument("--metadata", help="JSON object: git commit, dataset, metrics...")
    s.add_argument("--wait", type=float, default=0, help="seconds to wait for validation")
    s.set_defaults(fn=cmd_upload)
    s = sub.add_parser("versions", help="list versions of a model")
    s.add_argument("model")
    s.set_defaults(fn=cmd_versions)
    s = sub.add_parser("alias", help="point an alias at a version (or --delete it)")
    s.add_argument("model")
    s.add_argument("alias")
    s.add_argument("version", type=int, nargs="?")
    s.add_argument("--delete", action="store_true")
    s.set_defaults(fn=cmd_alias)
    s = sub.add_parser("deploy", help="make a ready version the endpoint's stable")
    s.add_argument("model")
    s.add_argument("version", type=int)
    s.add_argument("--reason", default="")
    s.add_argument("--wait", type=float, default=0, help="seconds to wait for all replicas")
    s.set_defaults(fn=cmd_deploy)
    _rollout_parsers(sub)
    _integration_parsers(sub)
    job_parsers(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    command = args.command
    if command.command == "alias" and not command.delete and command.version is None:
        parser().error("alias needs a version (or --delete)")
    if command.command == "shadow" and not command.stop and command.version is None:
        parser().error("shadow needs a version (or --stop)")
    creds = config.resolve(url=args.url, token=args.token)
    try:
        if getattr(command, "account", False):
            return command.fn(creds, command)
        return command.fn(Client(creds.url, creds.token), command)
    except CliError as exc:
        print(f"mmc: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
