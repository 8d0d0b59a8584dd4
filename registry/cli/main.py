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
    mmc export-state -o mmc.yaml               # deployments as code: today's state as a file
    mmc plan -f mmc.yaml                       # what applying it would change
    mmc apply -f mmc.yaml --source "$(git rev-parse HEAD)"   # --prune: remove leftovers

Exit status: 0 done; 1 the server refused (its message on stderr) or could not be reached;
2 the command line was wrong; 141 the output was closed before it was all written (`| head`).
`mmc plan` also exits 2 when the file would change something (0: it would change nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from mmc import Client, MmcError, Version, config
from registry.cli.account import account_parsers
from registry.cli.as_code import as_code_parsers
from registry.cli.drift import drift_parsers
from registry.cli.jobs import job_parsers
from registry.cli.output import CliError, print_json
from registry.cli.pipelines import pipeline_parsers
from registry.cli.teams import team_parsers


def cmd_models(c: Client, a) -> int:
    for m in c.list_models(search=a.search or None, tag=a.tag or None):
        print(f"{m.name:30} versions={m.version_count:<4} stable={m.stable_version}  "
              f"tags={','.join(m.tags)}")
    return 0


def cmd_create_model(c: Client, a) -> int:
    print_json(c.create_model(a.name, description=a.description, tags=a.tag or [],
                              team=a.team).raw)
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
    metadata = None
    if a.metadata:
        try:
            metadata = json.loads(a.metadata)  # fail here, not on the server, on bad JSON
        except ValueError as exc:
            raise CliError(f"--metadata is not valid JSON: {exc}") from None
    lineage = {k: v for k, v in (("run_url", a.run_url), ("git_commit", a.git_commit),
                                 ("dataset", a.dataset)) if v}
    version = c.upload(a.model, path, metadata=metadata, metrics=parse_metrics(a.metric) or None,
                       lineage=lineage or None)
    print(version.detail or f"uploaded {a.model}:{version.number} "
          f"(sha256 {version.sha256[:12]}), status {version.status}", file=sys.stderr)
    if a.wait or a.convert:
        version = c.wait_validated(a.model, version.number, timeout=a.wait or 120)
    if a.convert and (version.validation_report or {}).get("runtime_too_new"):
        version = _convert(c, a.model, version, a.wait or 120)
    print_json(version.raw)
    return 0 if version.status != "failed" else 2


def _convert(c: Client, model: str, version: Version, timeout: float) -> Version:
    """Validation said the runtime cannot load this IR version/opset: convert, then wait."""
    print(f"{model}:{version.number} failed validation: {version.failure_reason}",
          file=sys.stderr)
    new = c.convert(model, version.number)
    done = new.metadata.get("conversion") or {}
    frm, to, tol = done.get("from", {}), done.get("to", {}), done.get("tolerance", {})
    print(new.detail or (
        f"converted {model}:{version.number} (IR {frm.get('ir_version')}, opset "
        f"{frm.get('opset')}) to {model}:{new.number} (IR {to.get('ir_version')}, opset "
        f"{to.get('opset')}): outputs match, max abs diff {done.get('max_abs_diff')} "
        f"(rtol {tol.get('rtol')}, atol {tol.get('atol')})"), file=sys.stderr)
    return c.wait_validated(model, new.number, timeout=timeout)


def cmd_versions(c: Client, a) -> int:
    print(f"{'#':>4}  {'STATUS':10} {'SHA256':12}  {'BYTES':>10}  {'ALIASES':7}  METRICS  FAILURE")
    for v in c.list_versions(a.model, metric=a.metric or (), metadata=a.metadata or ()):
        metrics = " ".join(f"{k}={val:g}" for k, val in (v.metrics or {}).items())
        print(f"{v.number:>4}  {v.status:10} {v.sha256[:12]}  {v.size_bytes:>10}  "
              f"{','.join(v.aliases) or '-':7}  {metrics or '-'}  {v.failure_reason[:60]}"
              .rstrip())
    return 0


def cmd_delete(c: Client, a) -> int:
    """delete-version / delete-model: refused (409, printed) while anything holds a version."""
    if a.command == "delete-version":
        c.delete_version(a.model, a.version, reason=a.reason)
        print(f"deleted {a.model}:{a.version}", file=sys.stderr)
    else:
        c.delete_model(a.model, reason=a.reason)
        print(f"deleted model {a.model}", file=sys.stderr)
    return 0


def cmd_alias(c: Client, a) -> int:
    if a.delete:
        c.delete_alias(a.model, a.alias)
    else:
        print_json(c.set_alias(a.model, a.alias, a.version).raw)
    return 0


def cmd_deploy(c: Client, a) -> int:
    endpoint = c.deploy(a.model, a.version, reason=a.reason, wait=a.wait or None)
    print_json(endpoint.raw)
    return 0 if endpoint.converged else 3


def cmd_decide(c: Client, a) -> int:
    """approve / reject: the version's approval, decided by someone other than its uploader."""
    decide = c.approve if a.command == "approve" else c.reject
    version = decide(a.model, a.version, comment=a.comment)
    print(f"{a.model}:{a.version} {a.command}d", file=sys.stderr)  # a refusal raised already
    print_json(version.raw)
    return 0


ROLLOUT_OPS = {
    # command: (the client's method, positional args, help)
    "canary": ("canary", ("version",), "route --weight %% of traffic to a ready candidate"),
    "weight": ("set_weight", ("weight",), "set the candidate's share (0-100)"),
    "promote": ("promote", (), "make the candidate stable (old stable stays warm)"),
    "abort": ("abort", (), "drop the candidate"),
    "pause": ("pause_analysis", (), "pause the automated canary analysis"),
    "resume": ("resume_analysis", (), "resume the automated canary analysis"),
    "rollback": ("rollback", ("version",), "point stable at an earlier ready version"),
    "bg-deploy": ("bluegreen_deploy", ("version",), "load a version into the idle colour"),
    "switch": ("switch", (), "send all traffic to the idle colour"),
    "switch-back": ("switch_back", (), "send all traffic back"),
    "bg-finish": ("bluegreen_finish", (), "leave blue-green; drop the idle colour"),
    "shadow": ("start_shadow", ("version",), "mirror traffic to a version (or --stop)"),
}


def cmd_rollout(c: Client, a) -> int:
    method, positional, _ = ROLLOUT_OPS[a.command]
    args = [getattr(a, name) for name in positional]
    options = {"reason": a.reason, "wait": a.wait or None}
    if a.command == "canary":
        try:
            plan = json.loads(a.plan) if a.plan else None
        except ValueError as exc:
            raise CliError(f"--plan is not valid JSON: {exc}") from None
        options.update(weight=a.weight, override=a.override, plan=plan)
    if a.command == "rollback":
        options["unload_first"] = a.unload_first
    if a.command == "shadow" and a.stop:
        method, args = "stop_shadow", []
    endpoint = getattr(c, method)(a.model, *args, **options)
    print_json(endpoint.raw)
    return 0 if endpoint.converged else 3


def cmd_export(c: Client, a) -> int:
    """The client writes the archive whole (no half-written file); a KServe export is unpacked
    into the folder -o names (its files, ready for kubectl)."""
    if a.format == "kserve":
        export = c.export(a.model, a.output, format="kserve", runtime=a.runtime,
                          storage_uri=a.storage_uri or None, name=a.name or None)
    else:
        export = c.export(a.model, a.output, format=a.format, versions=a.versions or "all")
    versions = ",".join(str(v) for v in export.versions) or "?"
    if a.format == "kserve":
        for path in export.files:
            print(path)
        print(f"wrote {len(export.files)} files to {export.path} (versions {versions}); apply "
              f"with kubectl apply -f {export.path}", file=sys.stderr)
        return 0
    print(f"wrote {export.path} (versions {versions}, {export.size_bytes} bytes)",
          file=sys.stderr)
    return 0


def cmd_tensorrt(c: Client, a) -> int:
    print_json(c.build_tensorrt(a.model, a.version, precision=a.precision)
               .validation_report.get("tensorrt"))
    return 0


def cmd_webhooks(c: Client, a) -> int:
    for h in c.list_webhooks():
        print(f"{h.id:>4}  {'on ' if h.active else 'off'}  {h.model or '*':20} "
              f"{','.join(h.events) or '*':30} {h.url}")
    return 0


def cmd_webhook_add(c: Client, a) -> int:
    print_json(c.create_webhook(a.url, model=a.model, name=a.name, events=a.event or []).raw)
    return 0


def cmd_webhook_test(c: Client, a) -> int:
    delivery = c.test_webhook(a.id)
    print_json(delivery.raw)
    return 0 if delivery.status == "succeeded" else 2


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


def cmd_feedback(c: Client, a) -> int:
    """One label from the arguments, and/or a feedback body (one or a batch) from --file, sent
    as it is: the server checks it and names a bad field."""
    if a.request_id is None and not a.file:
        raise CliError("give REQUEST_ID LABEL, or --file with a feedback body")
    if a.file:
        body = sys.stdin.buffer.read() if a.file == "-" else Path(a.file).read_bytes()
        print_json(c.send_feedback(a.model, body))
    if a.request_id is not None:
        if a.label is None:
            raise CliError("give the label after the request id")
        try:
            label = json.loads(a.label)
        except ValueError:
            label = a.label  # a class name
        print_json(c.send_feedback(a.model, {a.request_id: label}))
    return 0


def cmd_capture(c: Client, a) -> int:
    """Without options: the settings and counts; with any: change those (audited)."""
    changes = {k: getattr(a, k) for k in ("percent", "mode", "max_bytes", "retention_days")
               if getattr(a, k) is not None}
    if a.off:
        changes["percent"] = 0
    if changes:
        print_json(c.set_capture(a.model, **changes, reason=a.reason))
    else:
        print_json(c.get_capture(a.model))
    return 0


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
    s.add_argument("--team", help="the team that owns it (default: 'default' where you may, "
                                  "else your only team)")
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
    s = sub.add_parser("feedback", help="send ground-truth labels for answered requests")
    s.add_argument("model")
    s.add_argument("request_id", nargs="?")
    s.add_argument("label", nargs="?", help="a class index or name, or a number (JSON)")
    s.add_argument("--file", help='a feedback body, {"feedback": [{"request_id", "label"}, '
                   '...]} (- for standard input)')
    s.set_defaults(fn=cmd_feedback)
    s = sub.add_parser("capture", help="show or change the endpoint's data capture")
    s.add_argument("model")
    s.add_argument("--percent", type=float, help="share of requests recorded, 0-100")
    s.add_argument("--mode", choices=["inputs", "outputs", "both"])
    s.add_argument("--max-bytes", type=int, help="tensor bytes one record keeps at most")
    s.add_argument("--retention-days", type=int, help="days records are kept")
    s.add_argument("--off", action="store_true", help="stop capturing (percent 0)")
    s.add_argument("--reason", default="")
    s.set_defaults(fn=cmd_capture)
    _integration_parsers(sub)
    job_parsers(sub)
    drift_parsers(sub)
    pipeline_parsers(sub)
    as_code_parsers(sub)
    team_parsers(sub)
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
        with Client(creds.url, creds.token) as client:
            return command.fn(client, command)
    except (CliError, MmcError) as exc:
        print(f"mmc: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
