"""v2 repository load/unload are part of the source protocol: the registry acts on them (as the
caller), a source edited elsewhere answers 501, and refusals keep their typed status."""

from __future__ import annotations

import asyncio

import pytest

from serving.core.dataplane import DataPlane
from serving.core.desired_state import (
    DesiredState,
    DesiredStateSource,
    ObservedState,
    ReadOnlySource,
)
from serving.core.errors import Forbidden, NotSupported, Unauthorized


class FolderSource(ReadOnlySource):
    """A source whose desired state is edited elsewhere (like a model repository folder)."""

    def revision(self) -> int:
        return 1

    def fetch(self) -> DesiredState:
        return DesiredState(1, {}, {})

    def report(self, observed: ObservedState) -> None:
        pass

    def subscribe(self, callback) -> None:
        pass


class ControlSource(FolderSource):
    """A source that acts on load/unload (like the registry), refusing as `refusal` says."""

    def __init__(self, refusal: Exception | None = None) -> None:
        self.refusal = refusal
        self.calls: list[tuple[str, str, str | None]] = []

    def request_load(self, model: str, authorization: str | None = None) -> None:
        self._act("load", model, authorization)

    def request_unload(self, model: str, authorization: str | None = None) -> None:
        self._act("unload", model, authorization)

    def _act(self, action: str, model: str, authorization: str | None) -> None:
        if self.refusal is not None:
            raise self.refusal
        self.calls.append((action, model, authorization))


def act(source, action: str, authorization: str | None = "Bearer t") -> list[bool]:
    """Ask a data plane over `source` to act; returns one entry per reconcile it triggered."""
    dataplane = DataPlane(replica="r")
    dataplane.source = source
    changes = []

    async def reconcile() -> None:
        changes.append(True)

    dataplane.on_repository_change = reconcile
    asyncio.run(dataplane.repository_action(action, "m", authorization))
    return changes


@pytest.mark.parametrize("action", ["load", "unload"])
def test_a_source_that_acts_is_asked_as_the_caller_and_the_replica_reconciles(action):
    source = ControlSource()
    assert isinstance(source, DesiredStateSource)
    reconciles = act(source, action)
    assert source.calls == [(action, "m", "Bearer t")]
    assert reconciles == [True]


@pytest.mark.parametrize("source", [FolderSource(), None], ids=["read-only source", "no source"])
def test_a_source_edited_elsewhere_answers_501_saying_where_to_go(source):
    with pytest.raises(NotSupported, match="load of model 'm' is not offered.*registry") as info:
        act(source, "load")
    assert info.value.status == 501


@pytest.mark.parametrize("refusal,status", [
    (Unauthorized("invalid or expired API token"), 401),
    (Forbidden("repository load/unload needs the engineer role"), 403),
])
def test_a_refused_caller_gets_the_typed_status_and_why(refusal, status):
    with pytest.raises(type(refusal)) as info:
        act(ControlSource(refusal), "unload")
    assert info.value.status == status
    assert info.value.message == f"unload of model 'm' refused: {refusal.message}"


def test_unauthorized_tells_the_client_how_to_authenticate():
    with pytest.raises(Unauthorized) as info:
        act(ControlSource(Unauthorized("no token")), "load", None)
    assert info.value.headers["WWW-Authenticate"] == "Bearer"
