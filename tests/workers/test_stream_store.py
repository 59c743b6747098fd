"""A streaming worker's store (workers/rollout/stream_store.py) holding, per whole group,
its samples and each stream-side node's rows of them (one Batch per producer): an
entrance pass's rows are placed by position, row-aligned with the samples it read;
each buffer takes its own producer's rows; a group leaves with its last producer's."""
from __future__ import annotations

import pytest
import torch

from hybridflow.core.batch import Batch
from hybridflow.workers.rollout.stream_store import SAMPLES, StreamStore


def _samples(uids: list[str]) -> Batch:
    n = len(uids)
    return Batch({"policy_version": torch.zeros(n, dtype=torch.long),
                  "token_versions": torch.zeros(n, 1, dtype=torch.long),
                  "response_length": torch.ones(n), "row": torch.arange(n)}, {"uid": uids})


def _store() -> StreamStore:
    store = StreamStore()
    store.expect({"a": 2, "b": 3})
    store.add(_samples(["b", "a", "b", "a", "b"]))  # rows 0..4, interleaved
    assert set(store.report()) == {"a", "b"}
    return store


def test_a_nodes_rows_are_placed_by_position_and_each_producer_is_taken_on_its_own():
    store = _store()
    read = store.take(["b", "a"], leave=True)  # what an entrance pass reads
    assert read["row"].tolist() == [0, 2, 4, 1, 3]
    out = Batch({"advantages": read["row"].float() * 10})  # no uid column: by position
    store.keep(out, ["b", "a"], [], producer="adv", layout=[("b", 3), ("a", 2)])
    adv = store.take(["a", "b"], producer="adv")
    samples = store.take(["a", "b"])
    assert adv["advantages"].tolist() == [x * 10.0 for x in samples["row"].tolist()]
    assert store.held() == 0 and not store.expected  # the last producer taken


def test_a_group_stays_until_every_producer_is_taken():
    store = _store()
    out = Batch({"ref": torch.arange(5.0)})
    store.keep(out, ["a", "b"], [], producer="ref", layout=[("a", 2), ("b", 3)])
    store.take(["a"])
    assert store.held() == 2 and set(store.whole["a"]) == {"ref"}
    with pytest.raises(KeyError, match=r"hold no rows of 'adv'"):
        store.take(["a"], producer="adv")
    assert store.take(["a"], producer="ref")["ref"].tolist() == [0.0, 1.0]
    assert store.held() == 1


def test_rows_that_do_not_match_the_groups_read_are_refused():
    store = _store()
    with pytest.raises(ValueError, match=r"has 4 rows, but the groups it read had 5"):
        store.keep(Batch({"adv": torch.zeros(4)}), ["a", "b"], [], producer="adv",
                   layout=[("a", 2), ("b", 3)])


def test_unread_samples_go_with_the_last_handed_over_node():
    store = _store()
    store.keep(Batch({"adv": torch.zeros(2)}), ["a"], [], producer="adv",
               layout=[("a", 2)], drop_samples=True)
    assert set(store.whole["a"]) == {"adv"} and SAMPLES in store.whole["b"]
    assert store.rows() == 3  # the samples held: b's


def test_a_filters_rows_replace_the_samples_and_drop_the_rest():
    store = _store()
    kept = store.take(["a"], leave=True)
    store.keep(kept.select("uid", "row"), ["a"], ["b"])
    assert store.held() == 1 and set(store.take(["a"]).keys()) == {"uid", "row"}
