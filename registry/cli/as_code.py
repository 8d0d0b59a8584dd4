"""`mmc plan`, `mmc apply`, `mmc export-state`: deployments as code (docs/guide/as-code.md).

    mmc plan -f mmc.yaml                   # exit 0: nothing would change; 2: changes (listed)
    mmc apply -f mmc.yaml --source "$(git rev-parse HEAD)"   # --prune: also remove leftovers
    mmc export-state -o mmc.yaml           # today's state as such a file

The state export is a command of its own, not `mmc export --state`: `mmc export MODEL -o FILE`
writes one model's Triton or KServe files, a different thing with different options, and a
flag that turned it into the whole registry's desired state would change what its positional
argument and -o mean."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from mmc import Client, Plan
from mmc.as_code import secrets_from_environment
from registry.cli.output import CliError, print_json

MARKS = {"create": "+", "update": "~", "delete": "-"}


def _read(name: str) -> str:
    if name == "-":
        return sys.stdin.read()
    try:
        return Path(name).read_text(encoding="utf-8")
    except OSError as exc:
        raise CliError(f"cannot read {name}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise CliError(f"{name} is not UTF-8 text: {exc}") from None


def _value(value) -> str:
    return json.dumps(value, separators=(", ", ": "))


def print_plan(plan: Plan) -> None:
    """The changes as a reader scans them: one line per resource (+ create, ~ update, - delete),
    its keys before -> after, the steps an apply takes, then the outcome in words."""
    for change in plan.changes:
        print(f"{MARKS.get(change['action'], '?')} {change['resource']}")
        before, after = change.get("before") or {}, change.get("after") or {}
        for key in dict.fromkeys([*before, *after]):
            if change["action"] == "update" and before.get(key) != after.get(key):
                print(f"    {key}: {_value(before.get(key))} -> {_value(after.get(key))}")
            elif change["action"] == "update":  # unchanged: the routing it stays part of
                print(f"    {key}: {_value(after.get(key))}")
            else:
                print(f"    {key}: {_value(after.get(key) if key in after else before[key])}")
        if len(change.get("steps") or ()) > 1 or change["action"] == "update":
            for n, step in enumerate(change.get("steps") or (), start=1):
                print(f"    {n}. {step}")
    for resource in plan.not_pruned:
        print(f"  kept, not named by the file (--prune removes it): {resource}")
    print(plan.detail)


def cmd_plan(c: Client, a) -> int:
    """Exit 2 when the file would change something, 0 when it would not: a CI gate."""
    text = _read(a.file)
    plan = c.plan(text, prune=a.prune, secrets=secrets_from_environment(text))
    print_json(plan.raw) if a.json else print_plan(plan)
    return 2 if plan.changed else 0


def cmd_apply(c: Client, a) -> int:
    text = _read(a.file)
    done = c.apply(text, source=a.source, prune=a.prune, secrets=secrets_from_environment(text))
    print_json(done.raw) if a.json else print_plan(done)
    if done.audit_event:
        print(f"audit event {done.audit_event} (file sha256 {done.sha256[:12]}"
              f"{', source ' + done.source if done.source else ''})", file=sys.stderr)
    return 0


def cmd_export_state(c: Client, a) -> int:
    text = c.export_state()
    if a.output == "-":
        sys.stdout.write(text)
        return 0
    Path(a.output).write_text(text, encoding="utf-8")
    print(f"wrote {a.output}", file=sys.stderr)
    return 0


def as_code_parsers(sub) -> None:
    for command, text in (("plan", "show what applying an mmc.yaml would change (exit 2 if "
                                   "anything, 0 if nothing)"),
                          ("apply", "make the registry what an mmc.yaml says (all or "
                                    "nothing)")):
        s = sub.add_parser(command, help=text)
        s.add_argument("-f", "--file", required=True, help="the mmc.yaml ('-': stdin)")
        s.add_argument("--prune", action="store_true",
                       help="also remove the aliases and webhooks the file's sections no longer "
                            "name (never models, versions or routing)")
        if command == "apply":
            s.add_argument("--source", default="",
                           help="where the file comes from, e.g. a git commit (audited)")
        s.add_argument("--json", action="store_true", help="print the server's answer as JSON")
        s.set_defaults(fn=cmd_plan if command == "plan" else cmd_apply)
    s = sub.add_parser("export-state", help="write today's state as an mmc.yaml (not `export`: "
                                            "that writes one model's Triton or KServe files)")
    s.add_argument("-o", "--output", required=True, help="the file to write ('-': stdout)")
    s.set_defaults(fn=cmd_export_state)
