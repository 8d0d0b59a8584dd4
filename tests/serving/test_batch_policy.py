"""Batch forming and splitting as a table: which queued requests leave together, when a batch
waits for company, and how outputs go back. Plain data in, plain data out: no threads, no loop."""

from __future__ import annotations

import numpy as np
import pytest

from serving.core.batch_policy import (
    BatchDecision,
    batch_key,
    form_batch,
    merge_inputs,
    split_outputs,
)

A = ("x", 11, (64,))  # two keys that never share a batch (different trailing shapes)
B = ("x", 11, (32,))
MS = 1_000_000


@pytest.mark.parametrize("case,pending,policy,expected", [
    # Natural batching: no delay, so whatever compatible is queued goes at once.
    ("idle: a lone request goes at once", [(1, A)], {}, BatchDecision((0,))),
    ("idle: everything compatible queued goes together", [(1, A), (2, A), (3, A)], {},
     BatchDecision((0, 1, 2))),
    ("no batch dimension: the head goes alone", [(1, A), (1, A)], {"max_rows": 0},
     BatchDecision((0,))),
    ("an unbatchable head goes alone", [(1, None), (1, A)], {}, BatchDecision((0,))),
    # The max batch size caps the rows; the first request that would overflow stays queued.
    ("rows stop at max_batch_size", [(3, A), (3, A), (3, A)], {"max_rows": 6},
     BatchDecision((0, 1))),
    ("an overflowing request is not skipped over", [(3, A), (4, A), (1, A)], {"max_rows": 6},
     BatchDecision((0,))),
    ("a head larger than the cap still runs, alone", [(9, A), (1, A)], {"max_rows": 6},
     BatchDecision((0,))),
    # Keys: different non-batch shapes never share a batch; the head's key leads.
    ("other keys are passed over, arrival order kept", [(1, A), (1, B), (1, A), (1, B)], {},
     BatchDecision((0, 2))),
    ("the head decides which key goes", [(1, B), (1, A), (1, B)], {}, BatchDecision((0, 2))),
    ("a request that went away (key None) joins nothing", [(1, A), (1, None), (1, A)], {},
     BatchDecision((0, 2))),
    # Delay: a batch that is not full waits until the head has waited the delay ...
    ("delay: a lone request waits for the rest of the delay", [(1, A)],
     {"delay_ns": 5 * MS, "waited_ns": 2 * MS}, BatchDecision((), 3 * MS)),
    ("delay spent: it goes with whatever came", [(1, A), (2, A)],
     {"delay_ns": 5 * MS, "waited_ns": 5 * MS}, BatchDecision((0, 1))),
    ("delay: a full batch does not wait", [(4, A), (4, A), (1, A)],
     {"max_rows": 8, "delay_ns": 5 * MS}, BatchDecision((0, 1))),
    ("delay: an unbatchable head does not wait", [(1, None)], {"delay_ns": 5 * MS},
     BatchDecision((0,))),
    # ... or leaves early at its largest preferred size (only with a delay, as in Triton).
    ("preferred: leaves early at the largest preferred size", [(2, A), (2, A), (1, A), (3, A)],
     {"preferred": frozenset({2, 4}), "delay_ns": 5 * MS}, BatchDecision((0, 1))),
    ("preferred: not reached yet, so it waits", [(1, A), (2, A)],
     {"preferred": frozenset({4}), "delay_ns": 5 * MS, "waited_ns": MS}, BatchDecision((), 4 * MS)),
    ("preferred sizes mean nothing without a delay", [(2, A), (1, A)],
     {"preferred": frozenset({2})}, BatchDecision((0, 1))),
])
def test_form_batch(case, pending, policy, expected):
    assert form_batch(pending, **{"max_rows": 32, **policy}) == expected, case


@pytest.mark.parametrize("inputs,expected", [
    ({"x": np.zeros((3, 64), np.float32)}, (3, ("x", np.dtype(np.float32).num, (64,)))),
    ({"b": np.zeros((2, 4), np.int64), "a": np.zeros((2,), np.float32)},
     (2, (("a", np.dtype(np.float32).num, ()), ("b", np.dtype(np.int64).num, (4,))))),
    ({"x": np.float32(1.0).reshape(())}, (1, None)),  # a scalar has no rows to merge
    ({"a": np.zeros((2, 4)), "b": np.zeros((3, 4))}, (2, None)),  # first dimensions disagree
])
def test_batch_key_says_rows_and_what_must_match_to_merge(inputs, expected):
    assert batch_key(inputs) == expected


def test_batch_keys_differ_for_other_trailing_shapes_dtypes_or_names():
    base = batch_key({"x": np.zeros((1, 64), np.float32)})[1]
    assert batch_key({"x": np.zeros((5, 64), np.float32)})[1] == base  # rows do not matter
    assert batch_key({"x": np.zeros((1, 32), np.float32)})[1] != base
    assert batch_key({"x": np.zeros((1, 64), np.float64)})[1] != base
    assert batch_key({"y": np.zeros((1, 64), np.float32)})[1] != base


def test_merged_inputs_split_back_to_each_request_by_its_rows():
    requests = [{"x": np.full((n, 2), i, np.int32)} for i, n in enumerate((1, 3, 2))]
    merged = merge_inputs(requests)
    assert merged["x"].shape == (6, 2)
    parts = split_outputs({"y": merged["x"] * 10}, [1, 3, 2])
    for i, (request, part) in enumerate(zip(requests, parts, strict=True)):
        np.testing.assert_array_equal(part["y"], request["x"] * 10)
        assert (part["y"] == 10 * i).all()


def test_a_lone_request_is_neither_copied_nor_checked():
    inputs = {"x": np.zeros((2, 2))}
    assert merge_inputs([inputs]) is inputs
    outputs = {"y": np.float32(3.0).reshape(())}  # no batch dimension: fine for one caller
    assert split_outputs(outputs, [2])[0] is outputs


def test_outputs_without_the_batch_rows_cannot_be_split():
    with pytest.raises(ValueError, match="no batch dimension of 3 rows"):
        split_outputs({"y": np.zeros((2, 4))}, [1, 2])
