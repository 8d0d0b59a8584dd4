r"""`mmc`: the registry from CI pipelines, over the REST API with a token.

    mmc login http://127.0.0.1:8000            # or, in CI: export MMC_URL=... MMC_TOKEN=mmc_...
    mmc whoami                                 # logout: revoke the token, forget it
    mmc create-model fraud --tag team:risk
    mmc upload fraud model.onnx --metric auc=0.91 --metric acc=0.88 --git-commit abc123 \
        --run-url https://mlflow/runs/7 --dataset tx-2026-10 --metadata '{"team": "ml"}' --wait 60
    mmc upload fraud today.onnx --convert      # IR/opset too new for the server: convert it
    mmc versions fraud --metric 'auc>0.9' --metadata team:ml
    mmc alias fraud production 3
    mmc delete-version fraud 2 --reason "superseded"   # or: delete-model fraud (all versions)
    mmc approve fraud 3 --comment "offline eval ok"   # or: reject fraud 3 --comment why
    mmc deploy fraud 3 --wait 30
    mmc canary fraud 4 --weight 5 --wait 30     # then: weight, promote, abort
    mmc canary fraud 4 --plan '{"steps": [5, 25, 50, 100], "bake_seconds": 300}'
    mmc rollback fraud 2 --unload-first        # also: bg-deploy, switch, switch-back, bg-finish
    mmc export fraud --versions 2,3 -o fraud-triton.tar.gz   # a Triton model repository
    mmc export fraud --format kserve -o kserve/fraud   # ServingRuntime + InferenceService YAML
    mmc tensorrt fraud 3 --precision fp16      # build a TensorRT engine on a GPU worker
    mmc webhook-add https://ci.example/hook --model fraud --event version.ready
    mmc webhooks                               # then: webhook-test ID
    mmc async-infer fraud request.json --wait 60 --out response.json
    mmc batch run fraud rows.npy --wait 600 --out scores.npy   # also: batch upload, job ID
    mmc pipeline create scorer --spec pipeline.json --create-model   # steps + edges

Exit status: 0 done; 1 the server refused (its message on stderr) or could not be reached;
2 the command line was wrong; 141 the output was closed before it was all written (`| head`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx

from registry.cli import config
from registry.cli.account import account_parsers
from registry.cli.client import Client, CliError, print_json
from registry.cli.jobs import job_parsers
from registry.cli.pipelines import pipeline_parsers


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


def parse_metrics(pairs: list[str] | None) -> dict[str, float]:
    """`--metric auc=0.91` (repeatable) -> {"auc": 0.91}; the server judges names and ranges."""
    metrics = {}
    for pair in pairs or ():
        name, sep, raw = pair.partition("=")
        try:
            value = float(raw)
        except ValueError:
            value = None
        if not sep or not name.strip() or value is None:
            raise CliError(f"--metric {pair!r}: expected NAME=NUMBER, e.g. auc=0.91")
        metrics[name.strip()] = int(value) if raw.strip().lstrip("-").isdigit() else value
    return metrics


def cmd_upload(c: Client, a) -> int:
    path = Path(a.file)
    if not path.is_file():
        raise CliError(f"{path} is not a file")
    params = {"filename": path.name}
    if a.metadata:
        try:
            json.loads(a.metadata)  # fail here, not on the server, on bad JSON
        except ValueError as exc:
            raise CliError(f"--metadata is not valid JSON: {exc}") from None
        params["metadata"] = a.metadata
    if metrics := parse_metrics(a.metric):
        params["metrics"] = json.dumps(metrics)
    lineage = {k: v for k, v in (("run_url", a.run_url), ("git_commit", a.git_commit),
                                 ("dataset", a.dataset)) if v}
    if lineage:
        params["lineage"] = json.dumps(lineage)
    with path.open("rb") as f:
        version = c.call("PUT", f"models/{a.model}/versions/upload/", params=params, content=f,
                         headers={"Content-Type": "application/octet-stream"})
    print(version.get("detail") or f"uploaded {a.model}:{version['number']} "
          f"(sha256 {version['sha256'][:12]}), status {version['status']}", file=sys.stderr)
    if a.wait or a.convert:
        version = _wait_validated(c, a.model, version["number"], a.wait or 120)
    if a.convert and (version.get("validation_report") or {}).get("runtime_too_new"):
        version = _convert(c, a.model, version, a.wait or 120)
    print_json(version)
    return 0 if version["status"] != "failed" else 2


def _convert(c: Client, model: str, version: dict, timeout: float) -> dict:
    """Validation said the runtime cannot load this IR version/opset: convert, then wait."""
    print(f"{model}:{version['number']} failed validation: {version['failure_reason']}",
          file=sys.stderr)
    new = c.call("POST", f"models/{model}/versions/{version['number']}/convert/")
    done = new["metadata"].get("conversion") or {}
    frm, to, tol = done.get("from", {}), done.get("to", {}), done.get("tolerance", {})
    print(new.get("detail") or (
        f"converted {model}:{version['number']} (IR {frm.get('ir_version')}, opset "
        f"{frm.get('opset')}) to {model}:{new['number']} (IR {to.get('ir_version')}, opset "
        f"{to.get('opset')}): outputs match, max abs diff {done.get('max_abs_diff')} "
        f"(rtol {tol.get('rtol')}, atol {tol.get('atol')})"), file=sys.stderr)
    return _wait_validated(c, model, new["number"], timeout)


def cmd_versions(c: Client, a) -> int:
    params = [("metric", m) for m in a.metric or ()] + [("metadata", m) for m in a.metadata or ()]
    print(f"{'#':>4}  {'STATUS':10} {'SHA256':12}  {'BYTES':>10}  {'ALIASES':7}  METRICS  FAILURE")
    for v in c.call("GET", f"models/{a.model}/versions/", params=params)["results"]:
        metrics = " ".join(f"{k}={val:g}" for k, val in (v.get("metrics") or {}).items())
        print(f"{v['number']:>4}  {v['status']:10} {v['sha256'][:12]}  {v['size_bytes']:>10}  "
              f"{','.join(v['aliases']) or '-':7}  {metrics or '-'}  {v['failure_reason'][:60]}"
              .rstrip())
    return 0


def cmd_delete(c: Client, a) -> int:
    """delete-version / delete-model: refused (409, printed) while anything holds a version."""
    what = f"{a.model}:{a.version}" if a.command == "delete-version" else f"model {a.model}"
    path = (f"models/{a.model}/versions/{a.version}/" if a.command == "delete-version"
            else f"models/{a.model}/")
    c.call("DELETE", path, params={"reason": a.reason} if a.reason else None)
    print(f"deleted {what}", file=sys.stderr)
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


def cmd_decide(c: Client, a) -> int:
    """approve / reject: the version's approval, decided by someone other than its uploader."""
    version = c.call("POST", f"models/{a.model}/versions/{a.version}/{a.command}/",
                     json={"comment": a.comment})
    print(f"{a.model}:{a.version} {a.command}d", file=sys.stderr)  # a refusal raised already
    print_json(version)
    return 0


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
    """Stream the archive to a temporary name, rename when complete: no half-written file.
    A KServe export is unpacked into the folder -o names (its files, ready for kubectl)."""
    out = Path(a.output)
    partial = out.with_name(out.name + ".part")
    if a.format == "kserve":  # downloaded aside, unpacked into the folder once complete
        fd, name = tempfile.mkstemp(prefix="mmc-kserve-", suffix=".tar.gz")
        os.close(fd)
        partial = Path(name)
        params = {"format": "kserve", "runtime": a.runtime}
        params |= {k: v for k, v in (("storage_uri", a.storage_uri), ("name", a.name)) if v}
    else:
        params = {"format": a.format, "versions": a.versions or "all"}
    try:
        with c.http.stream("GET", f"models/{a.model}/export", params=params) as r:
            if r.status_code >= 400:
                r.read()
                try:
                    message = r.json().get("error", r.text)
                except ValueError:
                    message = r.text
                partial.unlink(missing_ok=True)
                raise CliError(f"{r.status_code}: {message}")
            with partial.open("wb") as f:
                for chunk in r.iter_bytes():
                    f.write(chunk)
    except httpx.HTTPError as exc:
        partial.unlink(missing_ok=True)
        raise CliError(f"export failed: {exc}") from None
    versions = r.headers.get("X-Exported-Versions", "?")
    if a.format == "kserve":
        try:
            written = _unpack(partial, out)
        finally:
            partial.unlink(missing_ok=True)
        for path in written:
            print(path)
        print(f"wrote {len(written)} files to {out} (versions {versions}); apply with "
              f"kubectl apply -f {out}", file=sys.stderr)
        return 0
    partial.replace(out)
    print(f"wrote {out} (versions {versions}, {out.stat().st_size} bytes)", file=sys.stderr)
    return 0


def _unpack(archive: Path, folder: Path) -> list[Path]:
    """The archive's files under `folder`, without its top-level folder; tarfile's "data"
    filter refuses links and paths that would leave `folder`."""
    import tarfile

    with tarfile.open(archive, "r:gz") as tar:
        members = []
        for m in tar.getmembers():
            _, _, rest = m.name.partition("/")
            if rest:
                m.name = rest
                members.append(m)
        folder.mkdir(parents=True, exist_ok=True)
        tar.extractall(folder, members=members, filter="data")
    return sorted(folder / m.name for m in members if m.isfile())


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
    s = sub.add_parser("export", help="download a Triton model repository (.tar.gz), or "
                       "KServe resources for what the endpoint routes (a folder of YAML)")
    s.add_argument("model")
    s.add_argument("--format", default="triton", choices=["triton", "kserve"])
    s.add_argument("--versions", help="triton: 'all' (default: every ready version), 'stable' "
                   "or 1,2")
    s.add_argument("--runtime", default="mmc", choices=["mmc", "triton"],
                   help="kserve: the ServingRuntime, mmc-serve (default) or Triton")
    s.add_argument("--storage-uri", help="kserve: the artifact store as KServe reaches it "
                   "(default: the server's MMC_KSERVE_STORAGE_URI)")
    s.add_argument("--name", help="kserve: the InferenceService's name (default: the model's)")
    s.add_argument("-o", "--output", required=True,
                   help="triton: the .tar.gz to write; kserve: the folder to write the files to")
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
    s.add_argument("--metadata", help="free-form JSON object")
    s.add_argument("--metric", action="append", metavar="NAME=NUMBER",
                   help="an evaluation metric, e.g. auc=0.91 (repeat)")
    s.add_argument("--run-url", help="lineage: the training run's URL")
    s.add_argument("--git-commit", help="lineage: the commit it was trained from")
    s.add_argument("--dataset", help="lineage: the dataset it was trained on")
    s.add_argument("--wait", type=float, default=0, help="seconds to wait for validation")
    s.add_argument("--convert", action="store_true",
                   help="if validation fails because the IR version or opset is newer than the "
                        "server's onnxruntime loads, convert it (a new version) and wait for that")
    s.set_defaults(fn=cmd_upload)
    s = sub.add_parser("versions", help="list versions of a model")
    s.add_argument("model")
    s.add_argument("--metric", action="append", metavar="CONDITION",
                   help="only versions where it holds, e.g. 'auc>0.9' (repeat: all must)")
    s.add_argument("--metadata", action="append", metavar="KEY:VALUE",
                   help="only versions whose metadata has it, e.g. team:ml (repeat)")
    s.set_defaults(fn=cmd_versions)
    for command, text in (("delete-version", "delete a version nothing serves or refers to"),
                          ("delete-model", "delete a model and all its versions (none serving)")):
        s = sub.add_parser(command, help=text)
        s.add_argument("model")
        if command == "delete-version":
            s.add_argument("version", type=int)
        s.add_argument("--reason", default="", help="kept in the audit log")
        s.set_defaults(fn=cmd_delete)
    s = sub.add_parser("alias", help="point an alias at a version (or --delete it)")
    s.add_argument("model")
    s.add_argument("alias")
    s.add_argument("version", type=int, nargs="?")
    s.add_argument("--delete", action="store_true")
    s.set_defaults(fn=cmd_alias)
    for command, text in (("approve", "approve a version for promotion (not your own upload)"),
                          ("reject", "reject a version, saying why (not your own upload)")):
        s = sub.add_parser(command, help=text)
        s.add_argument("model")
        s.add_argument("version", type=int)
        s.add_argument("--comment", default="", required=command == "reject",
                       help="why (required to reject); kept with the decision")
        s.set_defaults(fn=cmd_decide)
    s = sub.add_parser("deploy", help="make a ready version the endpoint's stable")
    s.add_argument("model")
    s.add_argument("version", type=int)
    s.add_argument("--reason", default="")
    s.add_argument("--wait", type=float, default=0, help="seconds to wait for all replicas")
    s.set_defaults(fn=cmd_deploy)
    _rollout_parsers(sub)
    _integration_parsers(sub)
    job_parsers(sub)
    pipeline_parsers(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        code = _main(argv)
        sys.stdout.flush()  # a closed pipe is found here, not in the interpreter's exit
        return code
    except BrokenPipeError:
        # whoever read the output stopped (`mmc versions fraud | head`): no traceback, and no
        # second one when the interpreter flushes stdout at exit
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


def _main(argv: list[str] | None) -> int:
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
