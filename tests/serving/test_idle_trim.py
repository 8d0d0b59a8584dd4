"""A worker gives the heap a burst left behind back to the OS once it has been idle a while, and
never trims under a steady load (serving.edge_limits.IdleTrim, fed figures: no clock)."""

from __future__ import annotations

from serving.edge_limits import IdleTrim


def test_it_trims_once_after_a_burst_and_never_while_busy():
    policy = IdleTrim(5.0, now=0.0)
    assert not policy.due(0, 0.0, 100.0)  # nothing answered since start: nothing to give back
    # a steady load: every check finds a request ended within the last 5 s
    assert not any(policy.due(0, t - 1.0, t) for t in range(105, 200, 5))
    assert not policy.due(3, 10.0, 300.0)  # requests in flight, however old the last end
    assert policy.due(0, 300.0, 305.0)  # quiet for 5 s after the burst: trim
    assert not policy.due(0, 300.0, 310.0)  # once per pause, not once per check
    assert not policy.due(0, 312.0, 314.0)  # the next burst, not yet quiet
    assert policy.due(0, 312.0, 317.5)
