"""The Triton logging and trace extensions of one replica, as both fronts offer them: read the
settings, change them (an operator's call), keep them the same on every worker of the server.

Reading is open, as the other extensions' reads are. A change is an operator action: the
replica's source decides who may (`authorize_operator(authorization)`, asked by name like
request_load): a replica fed by a model repository folder is standalone, its operator owns the
process, and any caller may; one that follows the registry (in process or over HTTP) wants
`Authorization: Bearer <API token>` of an engineer or admin, as repository load/unload does; a
source that says nothing refuses (403).
"""

from __future__ import annotations

import asyncio
from typing import Any

from serving.core.errors import Forbidden, ReplicaStarting
from serving.core.logs import CONTROL, LogControl, LogSettings


class OperatorSettings:
    """Log and trace settings over one DataPlane (its `tracing`, its source, its models).
    `board`: where the workers of one server share them (serving.process.shared_settings), or
    None for a server of one process."""

    def __init__(self, dataplane: Any, logs: LogControl = CONTROL) -> None:
        self.dataplane = dataplane
        self.logs = logs
        self.board: Any = None

    # -- log settings ------------------------------------------------------------------------

    def log_settings(self) -> dict:
        self.follow()
        return self.logs.to_json()

    async def change_log_settings(self, doc, authorization: str | None) -> dict:
        await self._authorize(authorization, "changing the log settings")
        self.follow()
        answer = self.logs.update(doc)
        self._publish()
        return answer

    # -- trace settings ----------------------------------------------------------------------

    def trace_settings(self, model: str | None = None) -> dict:
        self._known(model)
        self.follow()
        return self.dataplane.tracing.to_json(model)

    async def change_trace_settings(self, doc, authorization: str | None,
                                    model: str | None = None) -> dict:
        """No settings (`doc` None or {}) for a model: its own settings are removed (Triton's
        HTTP protocol; over gRPC an empty request reads them)."""
        self._known(model)
        await self._authorize(authorization, "changing the trace settings")
        self.follow()
        tracing = self.dataplane.tracing
        answer = (tracing.clear(model) if model is not None and doc in (None, {})
                  else tracing.update({} if doc is None else doc, model))
        self._publish()
        return answer

    # -- the other workers -------------------------------------------------------------------

    def state(self) -> dict:
        return {"log": self.logs.settings.to_json(), "trace": self.dataplane.tracing.state()}

    def adopt(self, state: dict) -> None:
        log = {k: v for k, v in state["log"].items() if k != "log_file"}
        if LogSettings(**log) != self.logs.settings:
            self.logs.set(LogSettings(**log))
        self.dataplane.tracing.adopt(state["trace"])

    def follow(self) -> None:
        """Take the settings another worker changed since this one last looked."""
        if self.board is not None:
            state = self.board.changed()
            if state is not None:
                self.adopt(state)

    def _publish(self) -> None:
        if self.board is not None:
            self.board.publish(self.state())

    # -- checks ------------------------------------------------------------------------------

    def _known(self, model: str | None) -> None:
        dp = self.dataplane
        if model is None:
            return
        table = dp.table
        if model in table.routes or model in table.step_routes or table.versions_of(model):
            return
        raise dp.unknown_model(model)

    async def _authorize(self, authorization: str | None, what: str) -> None:
        authorize = getattr(self.dataplane.source, "authorize_operator", None)
        if authorize is None:
            if not self.dataplane.started:
                raise ReplicaStarting(self.dataplane.replica)
            raise Forbidden(f"{what} is not offered by this replica: its source does not say "
                            "who may")
        await asyncio.get_running_loop().run_in_executor(None, authorize, authorization, what)
