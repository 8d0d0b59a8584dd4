"""A model route knows which of its versions is live: blue-green's live slot wins, else the
stable (then the candidate). Requests that are not inferences read that one version."""

from __future__ import annotations

import pytest

from serving.core.desired_state import ModelRoute

BG = {"blue": "1", "green": "2", "stable": "7", "candidate": "8", "candidate_weight": 30}


@pytest.mark.parametrize("route,default,serving", [
    (ModelRoute("m", stable="1"), "1", {"1"}),
    (ModelRoute("m", stable="1", candidate="2", candidate_weight=10), "1", {"1", "2"}),
    (ModelRoute("m", stable="1", candidate="2", candidate_weight=100), "1", {"2"}),
    (ModelRoute("m", candidate="2", candidate_weight=0), "2", set()),
    (ModelRoute("m", live_color="blue", **BG), "1", {"1"}),
    (ModelRoute("m", live_color="green", **BG), "2", {"2"}),
    (ModelRoute("m", live_color="green", blue="1", stable="7"), None, set()),  # empty live slot
    (ModelRoute("m"), None, set()),
])
def test_the_default_version_and_the_versions_serving_unpinned_traffic(route, default, serving):
    assert route.default_version == default
    assert route.serving_versions() == serving


def test_blue_green_sends_every_unpinned_request_to_the_live_slot():
    route = ModelRoute("m", live_color="green", **BG)
    assert route.live_version == "2"
    assert {route.pick(sticky_key=str(k)) for k in range(200)} == {"2"}
    assert ModelRoute("m", stable="1").live_version is None
