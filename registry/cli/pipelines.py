"""`mmc pipeline`: create a pipeline version from a JSON spec file.

    mmc pipeline create scorer --spec pipeline.json     # {"steps": [...], "edges": [...]}
    mmc pipeline create scorer --spec pipeline.json --create-model
"""

from __future__ import annotations

import json
from pathlib import Path

from mmc import Client, NotFound
from registry.cli.output import CliError, print_json


def cmd_pipeline_create(c: Client, a) -> int:
    try:
        spec = json.loads(Path(a.spec).read_text())
    except OSError as exc:
        raise CliError(f"cannot read {a.spec}: {exc.strerror}") from None
    except ValueError as exc:
        raise CliError(f"{a.spec} is not JSON: {exc}") from None
    if a.create_model:
        try:
            c.get_model(a.model)
        except NotFound:
            c.create_model(a.model)
    print_json(c.create_pipeline(a.model, spec).raw)
    return 0


def pipeline_parsers(sub) -> None:
    pipeline = sub.add_parser("pipeline", help="pipelines: versions made of other models' "
                                               "versions").add_subparsers(
        dest="pipeline_command", required=True)
    s = pipeline.add_parser("create", help="create a pipeline version from a JSON spec")
    s.add_argument("model")
    s.add_argument("--spec", required=True,
                   help="a JSON file: {\"steps\": [{\"name\", \"model\", \"version\" or "
                        "\"alias\"}], \"edges\": [{\"from\", \"to\"}]}")
    s.add_argument("--create-model", action="store_true",
                   help="register the model name first if it does not exist")
    s.set_defaults(fn=cmd_pipeline_create)
