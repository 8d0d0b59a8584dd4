"""Deployments as code: plan and apply an mmc.yaml (what the registry should serve, kept in
git), and today's state exported as one. The server does the work (POST /api/v1/plan/ and
/apply/), so what a plan shows is what an apply of the same file would do."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from mmc.resources import Plan
from mmc.transport import Transport

#: `secret_env: NAME` in the file's YAML or JSON: a webhook's secret, read from the environment.
_SECRET_ENV = re.compile(r"""["']?\bsecret_env["']?\s*:\s*["']?([A-Za-z_][A-Za-z0-9_]*)""")


def secrets_from_environment(text: str,
                             environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The values of the environment variables the file's webhooks name in `secret_env` (those
    that are set): what plan and apply send besides the file, never in it."""
    environ = os.environ if environ is None else environ
    return {name: environ[name] for name in _SECRET_ENV.findall(text) if name in environ}


class AsCode(Transport):
    def _config(self, op: str, text: str, secrets: Mapping[str, str] | None,
                **fields: Any) -> Plan:
        body = {"file": text, **fields}
        if secrets:
            body["secrets"] = dict(secrets)
        return Plan.of(self._call("POST", f"{op}/", json=body))

    def plan(self, text: str, *, prune: bool = False,
             secrets: Mapping[str, str] | None = None) -> Plan:
        """What applying the file's `text` would change, resource by resource; changes nothing.
        Raises what the apply would raise (a Conflict naming the rule, a BadRequest naming the
        key's path)."""
        return self._config("plan", text, secrets, prune=prune)

    def apply(self, text: str, *, source: str = "", prune: bool = False,
              secrets: Mapping[str, str] | None = None) -> Plan:
        """Make the registry what the file says, all or nothing; `source` (e.g. a git commit)
        and the file's sha256 go into the audit event. `prune`: also remove the aliases and
        webhooks the file's sections no longer name."""
        return self._config("apply", text, secrets, prune=prune, source=source)

    def export_state(self) -> str:
        """Today's state as an mmc.yaml (webhooks, without secrets, for an admin)."""
        response = self._send(self.http.build_request("GET", "export/"))
        try:
            return response.text
        finally:
            response.close()

    def config_schema(self) -> dict[str, Any]:
        """The JSON Schema mmc.yaml is checked against (what editors validate with)."""
        return self._call("GET", "mmc.schema.json", anonymous=True)
