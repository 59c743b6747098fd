"""Batch (hybridflow/core/batch.py): split/concat, group-aware split, union, select/pop,
repeat, slicing, devices, non-tensor columns and cheap serialisation."""
from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridflow.core.batch import Batch, split_indices


def make_batch(rows: int, meta: dict | None = None) -> Batch:
    return Batch({"x": torch.arange(rows * 3, dtype=torch.float32).reshape(rows, 3),
                  "ids": torch.arange(rows)},
                 {"text": [f"row{i}" for i in range(rows)]}, meta or {"step": 7})


def assert_same(a: Batch, b: Batch) -> None:
    assert sorted(a.keys()) == sorted(b.keys())
    for k in a.tensors:
        assert a.tensors[k].dtype == b.tensors[k].dtype
        assert torch.equal(a.tensors[k], b.tensors[k]), k
    for k in a.non_tensors:
        assert list(a.non_tensors[k]) == list(b.non_tensors[k]), k


# ------------------------------------------------------------------ construction
def test_columns_must_agree_on_rows():
    with pytest.raises(ValueError, match="disagree"):
        Batch({"a": torch.zeros(3)}, {"b": ["x", "y"]})


def test_len_keys_contains_and_missing_key_message():
    b = make_batch(4)
    assert len(b) == 4 and "x" in b and "text" in b and "nope" not in b
    assert set(b.keys()) == {"x", "ids", "text"}
    with pytest.raises(KeyError, match="no key 'nope'"):
        b["nope"]
    assert b.get("nope", 5) == 5


def test_setitem_checks_rows_and_replaces_column_kind():
    b = make_batch(3)
    b["text"] = torch.ones(3)  # a non-tensor column becomes a tensor one
    assert "text" in b.tensors and "text" not in b.non_tensors
    with pytest.raises(ValueError, match="'bad' has 2 rows"):
        b["bad"] = torch.ones(2)


# ------------------------------------------------------------------ split / concat
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_split_round_trips_every_size_up_to_2n(n):
    for rows in range(1, 2 * n + 1):
        b = make_batch(rows)
        chunks = b.split(n)
        assert len(chunks) == n
        sizes = [len(c) for c in chunks]
        assert sum(sizes) == rows and max(sizes) - min(sizes) <= 1, (rows, sizes)
        assert all(c.meta == b.meta for c in chunks)
        assert_same(Batch.concat(chunks), b)


def test_split_rejects_zero_chunks():
    with pytest.raises(ValueError, match="0 chunks"):
        make_batch(2).split(0)


def test_concat_rejects_different_keys():
    with pytest.raises(ValueError, match="different keys"):
        Batch.concat([make_batch(2), make_batch(2).drop("text")])


def test_concat_skips_none_and_keyless_batches():
    assert len(Batch.concat([])) == 0
    assert_same(Batch.concat([None, make_batch(2)]), make_batch(2))
    # a rank that got no rows may answer with an empty Batch
    out = Batch.concat([Batch(meta={"m": 1}), make_batch(2), Batch()])
    assert_same(out, make_batch(2)) and out.meta == {"m": 1}


def _grouped(sizes: list[int], interleaved: bool) -> Batch:
    uids = [f"g{g}" for g, size in enumerate(sizes) for _ in range(size)]
    if interleaved:  # same groups, rows of different groups mixed
        uids = uids[::2] + uids[1::2]
    return Batch({"row": torch.arange(len(uids))}, {"uid": uids})


@settings(max_examples=150, deadline=None)
@given(sizes=st.lists(st.integers(1, 6), min_size=1, max_size=12),
       n=st.integers(1, 6), interleaved=st.booleans())
def test_group_split_never_breaks_a_group_and_balances(sizes, n, interleaved):
    b = _grouped(sizes, interleaved)
    chunks = b.split(n, group_by="uid")
    assert len(chunks) == n
    owner = {}
    for i, chunk in enumerate(chunks):
        for uid in chunk["uid"]:
            assert owner.setdefault(uid, i) == i, f"group {uid} split across chunks"
    rows = sorted(r for c in chunks for r in c["row"].tolist())
    assert rows == list(range(len(b)))  # every row exactly once
    # contiguous cuts of the groups: chunk sizes stay within one largest group of the
    # ideal share on each side
    ideal, biggest = len(b) / n, max(sizes)
    assert all(abs(len(c) - ideal) <= biggest for c in chunks), [len(c) for c in chunks]
    if not interleaved:  # contiguous groups: concat restores row order
        assert Batch.concat(chunks)["row"].tolist() == list(range(len(b)))


def test_group_split_equal_groups_divide_evenly():
    b = Batch({"r": torch.arange(12)}, {"uid": np.repeat(np.arange(6), 2)})
    assert [len(c) for c in b.split(3, group_by="uid")] == [4, 4, 4]


def test_group_split_with_tensor_group_column():
    b = Batch({"g": torch.tensor([0, 0, 1, 1, 2, 2])})
    assert [c["g"].tolist() for c in b.split(3, group_by="g")] == [[0, 0], [1, 1], [2, 2]]


def test_group_split_missing_key():
    with pytest.raises(KeyError, match="'uid'"):
        split_indices(make_batch(3), 2, group_by="uid")


# ------------------------------------------------------------------ union
def test_union_merges_columns_and_meta():
    a = Batch({"x": torch.ones(2)}, {"s": ["a", "b"]}, {"m": 1})
    b = Batch({"x": torch.ones(2), "y": torch.zeros(2)}, {"s": ["a", "b"]}, {"n": 2})
    u = a.union(b)
    assert set(u.keys()) == {"x", "y", "s"} and u.meta == {"m": 1, "n": 2}


def test_union_error_names_the_differing_tensor_key():
    a = Batch({"x": torch.ones(2)})
    with pytest.raises(ValueError, match="key 'x' differs"):
        a.union(Batch({"x": torch.zeros(2)}))


def test_union_error_names_the_differing_non_tensor_key():
    with pytest.raises(ValueError, match="key 'uid' differs"):
        Batch(non_tensors={"uid": ["a", "b"]}).union(Batch(non_tensors={"uid": ["a", "c"]}))


def test_union_rejects_a_key_that_is_a_tensor_on_one_side_only():
    with pytest.raises(ValueError, match="key 'uid' is a tensor in one"):
        Batch({"uid": torch.arange(2)}).union(Batch(non_tensors={"uid": ["a", "b"]}))


def test_union_rejects_row_mismatch():
    with pytest.raises(ValueError, match="2 and 3 rows"):
        make_batch(2).union(make_batch(3))


def test_update_lets_the_other_batch_win():
    a = Batch({"x": torch.ones(2)})
    assert a.update(Batch({"x": torch.zeros(2)}))["x"].tolist() == [0, 0]


# ------------------------------------------------------------------ select / pop
def test_select_and_pop():
    b = make_batch(3)
    s = b.select("x", "text")
    assert set(s.keys()) == {"x", "text"} and set(b.keys()) == {"x", "ids", "text"}
    with pytest.raises(KeyError, match="nope"):
        b.select("x", "nope")
    assert set(b.select("x", "nope", strict=False).keys()) == {"x"}
    p = b.pop("ids")
    assert set(p.keys()) == {"ids"} and set(b.keys()) == {"x", "text"}
    assert p.meta == b.meta


# ------------------------------------------------------------------ repeat / take
def test_repeat_interleaved_and_tiled():
    b = Batch({"x": torch.tensor([1, 2])}, {"s": ["a", "b"]})
    r = b.repeat(3, interleave=True)
    assert r["x"].tolist() == [1, 1, 1, 2, 2, 2] and list(r["s"]) == list("aaabbb")
    t = b.repeat(2, interleave=False)
    assert t["x"].tolist() == [1, 2, 1, 2] and list(t["s"]) == list("abab")


@pytest.mark.parametrize("index, expect", [
    (1, [1]), (-1, [4]), (-2, [3]), (slice(1, 3), [1, 2]), (slice(None, None, 2), [0, 2, 4]),
    (slice(None, None, -1), [4, 3, 2, 1, 0]), ([3, 0], [3, 0]), (np.array([4, 1]), [4, 1]),
    (torch.tensor([2]), [2]), (np.int64(3), [3]), ([], []), (np.arange(5)[::-2], [4, 2, 0]),
    ([True, False, True, False, False], [0, 2]),
])
def test_take_and_slicing(index, expect):
    b = make_batch(5)
    out = b[index]
    assert out["ids"].tolist() == expect
    assert list(out["text"]) == [f"row{i}" for i in expect]
    assert out.meta == b.meta


def test_take_out_of_range_row():
    with pytest.raises(IndexError, match="row 5 is out of range"):
        make_batch(5)[5]


def test_to_device_keeps_non_tensors():
    b = make_batch(2).to("cpu")
    assert b["x"].device.type == "cpu" and list(b["text"]) == ["row0", "row1"]
    b64 = make_batch(2).to(torch.float64)
    assert b64["x"].dtype == torch.float64


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_to_cuda_and_back():
    b = make_batch(3).to("cuda")
    assert b["x"].is_cuda
    assert_same(b.to("cpu"), make_batch(3))


# ------------------------------------------------------------------ non-tensor columns
def test_non_tensor_columns_of_strings_and_dicts_split_and_concat():
    infos = [{"i": i, "tags": ["t"] * i} for i in range(5)]
    b = Batch({"x": torch.arange(5)}, {"s": [f"s{i}" for i in range(5)], "info": infos})
    assert b["info"].dtype == object and b["info"][3] == {"i": 3, "tags": ["t"] * 3}
    back = Batch.concat(b.split(2))
    assert list(back["info"]) == infos and list(back["s"]) == list(b["s"])
    # a column of equal-length lists stays one object per row
    lists = Batch(non_tensors={"l": [[1, 2], [3, 4], [5, 6]]})
    assert len(lists) == 3 and lists["l"][1] == [3, 4]


def test_batch_of_only_non_tensors():
    b = Batch(non_tensors={"s": ["a", "b", "c"]})
    assert len(b) == 3 and [list(c["s"]) for c in b.split(2)] == [["a", "b"], ["c"]]


# ------------------------------------------------------------------ serialisation
def test_pickle_round_trip_keeps_bf16_and_meta():
    b = Batch({"h": torch.randn(4, 3).to(torch.bfloat16), "m": torch.ones(4, dtype=torch.bool)},
              {"s": list("abcd"), "d": [{"k": i} for i in range(4)]}, {"metrics": {"a": 1.0}})
    for protocol in (2, 4, 5):
        out = pickle.loads(pickle.dumps(b, protocol=protocol))
        assert out["h"].dtype == torch.bfloat16 and out.meta == b.meta
        assert_same(out, b)


def test_pickle_of_non_contiguous_and_grad_tensors():
    base = torch.arange(12.0).reshape(3, 4)
    b = Batch({"t": base.t(), "g": torch.ones(4, requires_grad=True)})
    out = pickle.loads(pickle.dumps(b))
    assert torch.equal(out["t"], base.t()) and not out["g"].requires_grad


def test_protocol5_moves_tensors_out_of_band_and_they_stay_writable():
    rows = 1024
    b = Batch({"a": torch.randn(rows, 512), "b": torch.randn(rows, 256).to(torch.bfloat16)},
              meta={"step": 3})
    assert b.nbytes >= 2 * 1024 * 1024
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(b, protocol=5, buffer_callback=buffers.append)
    assert len(data) < 2048, len(data)
    assert sum(memoryview(x).nbytes for x in buffers) == b.nbytes
    out = pickle.loads(data, buffers=[bytearray(x.raw()) for x in buffers])
    assert_same(out, b)
    out["a"][0, 0] = 42.0  # writable, no warning about read-only memory
    assert out["a"][0, 0] == 42.0


def test_read_only_buffers_are_copied_into_writable_tensors():
    b = make_batch(4).select("x")
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(b, protocol=5, buffer_callback=buffers.append)
    out = pickle.loads(data, buffers=[bytes(x.raw()) for x in buffers])  # read-only, like Ray
    out["x"] += 1
    assert torch.equal(out["x"], make_batch(4)["x"] + 1)


def test_protocol5_sends_each_tensor_as_raw_bytes_with_dtype_and_shape():
    """No numpy reconstructor in the stream (Ray's cloudpickle looks each one up: the
    cost of a small batch); empty columns and every dtype survive, in band and out."""
    b = Batch({"e": torch.zeros(3, 0), "i": torch.arange(6, dtype=torch.int64).view(3, 2),
               "h": torch.randn(3, 2).to(torch.bfloat16), "m": torch.tensor([True, False, True])},
              meta={"k": 1})
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(b, protocol=5, buffer_callback=buffers.append)
    assert b"numpy" not in data and len(buffers) == 4
    for out in (pickle.loads(data, buffers=[bytes(x.raw()) for x in buffers]),
                pickle.loads(pickle.dumps(b, protocol=5))):  # out of band, in band
        assert_same(out, b)
        assert out["h"].dtype == torch.bfloat16 and out.meta == {"k": 1}
        out["i"] += 1  # writable
    assert len(pickle.loads(pickle.dumps(Batch(), protocol=5))) == 0


def test_nbytes_counts_tensor_payload():
    assert Batch({"x": torch.zeros(4, 2, dtype=torch.float32)}).nbytes == 32
