"""The streaming buffer, both halves: the rows wait on the rollout worker that made them
(workers/rollout/stream_store.py) and the driver keeps a ledger of whole groups and
their numbers (runtime/run_long/stream_buffer.py). A group becomes whole once all its samples
finished and leaves whole, in the order groups completed; a group with a sample older
than the admission bound is handed back (regenerated), never trained; the driver's
ledger never holds a row."""
import pytest
import torch

from hybridflow.core.batch import Batch
from hybridflow.runtime.run_long.stream_buffer import GroupBuffer, GroupStats
from hybridflow.workers.rollout.stream_store import StreamStore, group_stats


def rows(uids, versions, tokens=None):
    versions = torch.tensor(versions)
    tokens = versions[:, None].repeat(1, 2) if tokens is None else torch.tensor(tokens)
    return Batch({"policy_version": versions, "token_versions": tokens,
                  "response_length": torch.full((len(versions),), 2.0)},
                 {"uid": list(uids)})


class Pair:
    """One worker's store and the driver's ledger, wired as a poll wires them."""

    def __init__(self, screened=False):
        self.store, self.ledger = StreamStore(), GroupBuffer(screened=screened)

    def expect(self, counts):
        self.store.expect(counts)
        self.ledger.expect(counts)

    def finish(self, batch):
        self.store.add(batch)
        self.ledger.add(self.store.report())


def test_a_group_is_released_whole_once_all_its_samples_finished():
    p = Pair()
    p.expect({"a": 2, "b": 2})
    p.finish(rows(["a", "b"], [3, 3]))
    assert p.ledger.held() == 0 and p.ledger.take(1, 3, 1) == ([], [])
    p.finish(rows(["b"], [3]))
    taken, stale = p.ledger.take(1, 3, 1)
    assert [u for u, _ in taken] == ["b"] and taken[0][1].rows == 2 and stale == []
    assert len(p.store.take(["b"])) == 2 and "b" not in p.store.whole
    p.finish(rows(["a"], [3]))
    assert [u for u, _ in p.ledger.take(1, 3, 1)[0]] == ["a"]


def test_groups_leave_in_completion_order_and_n_at_a_time():
    p = Pair()
    p.expect({"a": 1, "b": 1, "c": 1})
    p.finish(rows(["c", "a"], [0, 0]))
    assert p.ledger.take(3, 0, 1) == ([], [])  # two whole, three needed: nothing leaves
    p.finish(rows(["b"], [0]))
    uids = [u for u, _ in p.ledger.take(3, 0, 1)[0]]
    assert uids == ["c", "a", "b"]
    assert list(p.store.take(uids)["uid"]) == ["c", "a", "b"]


@pytest.mark.parametrize("k", [1, 2])
def test_admission_is_per_sample_and_a_stale_group_is_handed_back(k):
    p = Pair()
    p.expect({"old": 2, "ok": 2})
    trained = 5
    p.finish(rows(["old", "old", "ok", "ok"], [trained - k, trained - k - 1,
                                                trained - k, trained]))
    taken, stale = p.ledger.take(1, trained, k)
    assert stale == ["old"] and [u for u, _ in taken] == ["ok"]
    assert "old" not in p.ledger.expected and p.ledger.held() == 0
    p.expect({"old": 2})  # generated again: the worker forgets the stale rows
    assert "old" not in p.store.whole


def test_a_group_reported_but_never_submitted_is_an_error():
    buf = GroupBuffer()
    with pytest.raises(RuntimeError, match="uid 'x'.*never submitted"):
        buf.add({"x": group_stats(rows(["x"], [0])).as_tuple()})


def test_the_store_drops_rows_of_groups_it_does_not_expect():
    store = StreamStore()
    store.expect({"a": 1})
    store.add(rows(["a", "gone"], [0, 0]))  # "gone" was aborted or re-submitted
    assert list(store.report()) == ["a"] and "gone" not in store.partial


def test_a_screened_buffer_holds_whole_groups_until_the_filter_settles_them():
    p = Pair(screened=True)
    p.expect({"a": 1, "b": 1, "c": 2})
    p.finish(rows(["b", "a", "c"], [0, 0, 0]))
    assert p.ledger.held() == 0 and p.ledger.take(1, 0, 1) == ([], [])  # not screened
    arrived = p.ledger.arrivals()
    assert [u for u, _ in arrived] == ["b", "a"] and p.ledger.arrivals() == []
    screened = p.store.take(["b", "a"], leave=True)  # read where they wait
    assert len(screened) == 2 and p.store.held() == 2
    kept = screened.take([1])
    kept["score"] = torch.tensor([1.0])  # the filter's column comes back with its rows
    p.store.keep(kept, ["a"], ["b"])
    p.ledger.settle([arrived[1]], ["b"])
    assert "b" not in p.ledger.expected and p.ledger.held() == 1
    assert "b" not in p.store.whole and "score" in p.store.take(["a"])
    p.finish(rows(["c"], [0]))  # c whole now
    assert [u for u, _ in p.ledger.arrivals()] == ["c"]


def test_a_short_take_releases_the_whole_groups_there_are():
    p = Pair()
    p.expect({"a": 1, "b": 1})
    p.finish(rows(["a"], [0]))
    assert p.ledger.take(2, 0, 1) == ([], [])
    assert [u for u, _ in p.ledger.take(2, 0, 1, short=True)[0]] == ["a"]
    assert p.ledger.take(2, 0, 1, short=True) == ([], [])  # none whole: nothing


def test_group_numbers_give_a_batchs_means_exactly():
    """The driver's metrics come from these sums: equal to the rows' own means."""
    a = rows(["a", "a"], [1, 2], tokens=[[1, -1], [1, 2]])
    b = rows(["b"], [3], tokens=[[3, 3]])
    stats = [group_stats(a), group_stats(b)]
    both = Batch.concat([a, b])
    assert sum(s.version_sum for s in stats) / 3 == pytest.approx(
        float(both["policy_version"].float().mean()))
    real = both["token_versions"] >= 0
    assert sum(s.token_version_sum for s in stats) / sum(s.tokens for s in stats) == \
        pytest.approx(float(both["token_versions"][real].float().mean()))
    assert [s.mixed_rows for s in stats] == [1, 0] and min(s.min_version for s in stats) == 1
    assert isinstance(GroupStats(*stats[0].as_tuple()), GroupStats)
