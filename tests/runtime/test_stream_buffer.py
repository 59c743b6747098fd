"""The streaming buffer (runtime/stream_buffer.py): samples enter as they finish, a
group leaves whole, in the order groups completed, and a group with a sample older
than the admission bound is handed back (regenerated), never trained."""
import pytest
import torch

from hybridflow.core.batch import Batch
from hybridflow.runtime.stream_buffer import GroupBuffer


def rows(uids, versions):
    return Batch({"policy_version": torch.tensor(versions)}, {"uid": list(uids)})


def test_a_group_is_released_whole_once_all_its_samples_finished():
    buf = GroupBuffer()
    buf.expect({"a": 2, "b": 2})
    buf.add(rows(["a", "b"], [3, 3]))
    assert buf.held() == 0 and buf.take(1, 3, 1) == ([], [])
    buf.add(rows(["b"], [3]))
    taken, stale = buf.take(1, 3, 1)
    assert [u for u, _ in taken] == ["b"] and len(taken[0][1]) == 2 and stale == []
    buf.add(rows(["a"], [3]))
    assert [u for u, _ in buf.take(1, 3, 1)[0]] == ["a"]


def test_groups_leave_in_completion_order_and_n_at_a_time():
    buf = GroupBuffer()
    buf.expect({"a": 1, "b": 1, "c": 1})
    buf.add(rows(["c", "a"], [0, 0]))
    assert buf.take(3, 0, 1) == ([], [])  # two whole, three needed: nothing leaves
    buf.add(rows(["b"], [0]))
    assert [u for u, _ in buf.take(3, 0, 1)[0]] == ["c", "a", "b"]


@pytest.mark.parametrize("k", [1, 2])
def test_admission_is_per_sample_and_a_stale_group_is_handed_back(k):
    buf = GroupBuffer()
    buf.expect({"old": 2, "ok": 2})
    trained = 5
    buf.add(rows(["old", "old", "ok", "ok"], [trained - k, trained - k - 1,
                                               trained - k, trained]))
    taken, stale = buf.take(1, trained, k)
    assert stale == ["old"] and [u for u, _ in taken] == ["ok"]
    assert "old" not in buf.expected and buf.held() == 0


def test_samples_of_an_unknown_group_are_an_error():
    buf = GroupBuffer()
    with pytest.raises(RuntimeError, match="uid 'x'.*never submitted"):
        buf.add(rows(["x"], [0]))


def test_a_screened_buffer_holds_whole_groups_until_the_filter_settles_them():
    buf = GroupBuffer(screened=True)
    buf.expect({"a": 1, "b": 1, "c": 2})
    buf.add(rows(["b", "a", "c"], [0, 0, 0]))
    assert buf.held() == 0 and buf.take(1, 0, 1) == ([], [])  # not screened yet
    arrived = buf.arrivals()
    assert [u for u, _ in arrived] == ["b", "a"] and buf.arrivals() == []
    buf.settle([("a", rows(["a"], [0]))], ["b"])
    assert "b" not in buf.expected and buf.held() == 1
    buf.add(rows(["c"], [0]))  # c whole now
    assert [u for u, _ in buf.arrivals()] == ["c"]


def test_a_short_take_releases_the_whole_groups_there_are():
    buf = GroupBuffer()
    buf.expect({"a": 1, "b": 1})
    buf.add(rows(["a"], [0]))
    assert buf.take(2, 0, 1) == ([], [])
    assert [u for u, _ in buf.take(2, 0, 1, short=True)[0]] == ["a"]
    assert buf.take(2, 0, 1, short=True) == ([], [])  # none whole: nothing, even short
