"""Method declarations, dispatch modes and their slot layouts (hybridflow/graph/dispatch.py)."""
from __future__ import annotations

import uuid

import pytest
import torch

from hybridflow.core.batch import Batch
from hybridflow.graph.dispatch import (BROADCAST, DP, DP_TP, ONE_PER_WORKER, RANK_ZERO, SKIP,
                                       Layout, SlotLayout, get_dispatch_mode, merge_metrics, method,
                                       method_spec, register_dispatch_mode, worker_methods)
from hybridflow.core.kinds import NodeKind


def rows(n: int) -> Batch:
    return Batch({"x": torch.arange(n)}, {"s": [f"r{i}" for i in range(n)]})


def fake_worker_outputs(shards: list, scale: int = 10, metrics=None) -> list:
    """What DP ranks return: their rows transformed, with per-rank metrics."""
    outs = []
    for rank, shard in enumerate(shards):
        out = Batch({"y": shard["x"] * scale}, {"s": shard["s"]})
        if metrics is not None:
            out.meta["metrics"] = metrics(rank)
        outs.append(out)
    return outs


# ------------------------------------------------------------------ declarations
class Worker:
    @method(dispatch=DP, reads=("x",), writes=("y",), kind="inference")
    def infer(self, batch, micro_batch_size=8, *, temperature=1.0): ...

    @method(dispatch=RANK_ZERO, reads="input_ids", writes="loss", kind="train")
    def train(self, batch, **kwargs): ...

    def helper(self): ...


def test_method_records_its_contract():
    spec = method_spec(Worker, "infer")
    assert (spec.name, spec.dispatch, spec.reads, spec.writes, spec.kind) == \
        ("infer", DP, ("x",), ("y",), NodeKind.INFERENCE)
    assert spec.kind is NodeKind.INFERENCE  # the string is converted on entry
    assert spec.params == ("micro_batch_size", "temperature") and not spec.accepts_any_kwargs
    assert method_spec(Worker, "train").accepts_any_kwargs
    assert method_spec(Worker(), "infer") == spec  # from an instance too
    assert method_spec(Worker, "helper") is None


def test_a_single_key_string_is_one_key_not_its_letters():
    spec = method_spec(Worker, "train")
    assert spec.reads == ("input_ids",) and spec.writes == ("loss",)


def test_worker_methods_lists_only_declared_methods():
    assert sorted(worker_methods(Worker)) == ["infer", "train"]


def test_method_rejects_unknown_kind():
    with pytest.raises(ValueError, match="'training'"):
        method(kind="training")


# ------------------------------------------------------------------ modes
def test_broadcast_gives_every_rank_all_rows_and_keeps_rank_zeros_result():
    mode, layout = get_dispatch_mode(BROADCAST), Layout(3)
    assert mode.slot_layout(layout) == SlotLayout(1, (0, 0, 0), (0,))
    args = mode.dispatch(rows(4), layout)
    assert len(args) == 3 and all(a is args[0] for a in args)
    assert args[0]["x"].tolist() == [0, 1, 2, 3]
    outs = fake_worker_outputs(args, metrics=lambda r: {"rank": float(r)})
    out = mode.collect(outs, layout)
    assert out["y"].tolist() == [0, 10, 20, 30] and out.meta["metrics"] == {"rank": 0.0}


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_dp_splits_and_concats_back_for_every_size(world):
    mode, layout = get_dispatch_mode(DP), Layout(world)
    for n in range(1, 2 * world + 1):
        shards = mode.dispatch(rows(n), layout)
        assert len(shards) == world and sum(len(s) for s in shards) == n
        out = mode.collect(fake_worker_outputs(shards), layout)
        assert out["y"].tolist() == [10 * i for i in range(n)]
        assert list(out["s"]) == [f"r{i}" for i in range(n)]


def test_dp_collect_accepts_an_empty_answer_from_a_rank_without_rows():
    mode, layout = get_dispatch_mode(DP), Layout(3)
    shards = mode.dispatch(rows(2), layout)
    assert [len(s) for s in shards] == [1, 1, 0]
    outs = fake_worker_outputs(shards[:2]) + [Batch()]
    assert mode.collect(outs, layout)["y"].tolist() == [0, 10]


def test_dp_collect_merges_metrics_by_mean():
    mode, layout = get_dispatch_mode(DP), Layout(4)
    shards = mode.dispatch(rows(8), layout)
    out = mode.collect(fake_worker_outputs(
        shards, metrics=lambda r: {"loss": float(r), "count": r, "name": f"rank{r}"}), layout)
    metrics = out.meta["metrics"]
    assert metrics["loss"] == pytest.approx(1.5) and metrics["count"] == pytest.approx(1.5)
    assert metrics["name"] == "rank0"  # non-numeric: the first rank's


def test_merge_metrics_handles_keys_missing_on_some_ranks_and_numpy_scalars():
    np = pytest.importorskip("numpy")
    merged = merge_metrics([{"a": 1.0, "b": np.float32(2.0)}, {"b": np.float32(4.0)}])
    assert merged["a"] == 1.0 and merged["b"] == pytest.approx(3.0)


def test_dp_collect_without_metrics_adds_none():
    mode, layout = get_dispatch_mode(DP), Layout(2)
    out = mode.collect(fake_worker_outputs(mode.dispatch(rows(3), layout)), layout)
    assert "metrics" not in out.meta


def test_one_per_worker_takes_a_list_of_world_size():
    mode, layout = get_dispatch_mode(ONE_PER_WORKER), Layout(3)
    assert mode.dispatch([1, 2, 3], layout) == [1, 2, 3]
    assert mode.collect([4, 5, 6], layout) == [4, 5, 6]
    with pytest.raises(ValueError, match="list of 3 inputs, got list"):
        mode.dispatch([1, 2], layout)
    with pytest.raises(ValueError, match="got Batch"):
        mode.dispatch(rows(3), layout)


def test_rank_zero_runs_on_rank_zero_only():
    mode, layout = get_dispatch_mode(RANK_ZERO), Layout(4)
    assert mode.slot_layout(layout) == SlotLayout(1, (0, None, None, None), (0,))
    args = mode.dispatch(rows(2), layout)
    assert args[0]["x"].tolist() == [0, 1] and all(a is SKIP for a in args[1:])
    out = mode.collect(fake_worker_outputs(args[:1]) + [None] * 3, layout)
    assert out["y"].tolist() == [0, 10]


def test_dp_tp_gives_replicas_one_shard_and_collects_one_per_group():
    mode, layout = get_dispatch_mode(DP_TP), Layout(world_size=6, tp_size=2)
    assert layout.dp_size == 3
    assert mode.slot_layout(layout) == SlotLayout(3, (0, 0, 1, 1, 2, 2), (0, 2, 4))
    shards = mode.dispatch(rows(7), layout)
    assert len(shards) == 6
    for group in range(3):  # ranks 2g and 2g+1 hold the same shard
        assert shards[2 * group] is shards[2 * group + 1]
    assert [len(shards[r]) for r in (0, 2, 4)] == [3, 2, 2]
    outs = fake_worker_outputs(shards, metrics=lambda r: {"loss": float(r)})
    out = mode.collect(outs, layout)
    assert out["y"].tolist() == [10 * i for i in range(7)]  # no duplicated rows
    # one rank per replica group, weighted by the rows of its shard (3, 2, 2)
    assert out.meta["metrics"]["loss"] == pytest.approx((0 * 3 + 2 * 2 + 4 * 2) / 7)


@pytest.mark.parametrize("mode_name", [DP, DP_TP])
@pytest.mark.parametrize("tp,sp", [(1, 2), (1, 4), (2, 2)])
def test_a_row_group_of_sp_ranks_receives_one_shard(mode_name, tp, sp):
    """The sp ranks of a row group split each row's positions: they must hold the
    same rows (a rank given other rows would attend over another row's positions)."""
    from hybridflow.core.layout import RoleLayout
    mode, layout = get_dispatch_mode(mode_name), RoleLayout(8, tp=tp, sp=sp)
    shards = mode.dispatch(rows(8), layout)
    for dp_rank in range(layout.dp):
        group = layout.row_group(dp_rank)
        assert all(shards[r] is shards[group[0]] for r in group), (dp_rank, group)
    out = mode.collect(fake_worker_outputs(shards), layout)
    assert out["y"].tolist() == [10 * i for i in range(8)]  # each row once


def test_dp_tp_with_tp_one_is_plain_dp():
    mode, layout = get_dispatch_mode(DP_TP), Layout(3, 1)
    out = mode.collect(fake_worker_outputs(mode.dispatch(rows(5), layout)), layout)
    assert out["y"].tolist() == [0, 10, 20, 30, 40]


def test_layout_rejects_world_size_not_divisible_by_tp():
    with pytest.raises(ValueError, match="tensor-parallel size 2, which does not divide "
                                         r"the 5 device\(s\)"):
        Layout(5, 2)


# ------------------------------------------------------------------ user modes
def test_user_registered_slot_layout_dispatches_and_collects():
    name = f"last_two_{uuid.uuid4().hex[:6]}"

    def slots(layout):  # rows split over the last two ranks; the others idle
        w = layout.world_size
        return SlotLayout(2, (None,) * (w - 2) + (0, 1), (w - 2, w - 1))

    register_dispatch_mode(name, slots=slots)
    mode = get_dispatch_mode(name)
    assert mode.name == name and mode.slot_layout(Layout(4)).slots == 2
    args = mode.dispatch(rows(5), Layout(4))
    assert args[:2] == [SKIP, SKIP] and [a["x"].tolist() for a in args[2:]] == [[0, 1, 2], [3, 4]]
    out = mode.collect([None, None, *fake_worker_outputs(args[2:])], Layout(4))
    assert out["y"].tolist() == [0, 10, 20, 30, 40]

    class W:
        @method(dispatch=name)
        def go(self, batch): ...
    assert method_spec(W, "go").dispatch == name


def test_a_function_pair_mode_is_refused_with_the_way_to_declare_it():
    """The (dispatch, collect) pair form was removed: registering one names the mode,
    says what replaces it and where the migration is written, and registers nothing."""
    name = f"first_two_{uuid.uuid4().hex[:6]}"

    def dispatch(value, layout):
        return [value, value] + [SKIP] * (layout.world_size - 2)

    def collect(outputs, layout):
        return sum(o for o in outputs[:2])

    for call in (lambda: register_dispatch_mode(name, dispatch, collect),
                 lambda: register_dispatch_mode(name, dispatch=dispatch, collect=collect)):
        with pytest.raises(ValueError, match=rf"dispatch mode '{name}'.*\(dispatch, collect\) "
                                             r"pair.*slots=fn\(layout\) -> SlotLayout.*"
                                             r"docs/runtime.md"):
            call()
    with pytest.raises(ValueError, match="unknown dispatch mode"):
        get_dispatch_mode(name)


@pytest.mark.parametrize("slots, rank_slots, collect, message", [
    (2, (0, 1), (0,), "one collecting rank per slot"),
    (2, (0, 0), (0, 1), "slot 1 is collected from rank 1, which does not receive it"),
    (1, (0, 3), (0,), "rank 1 receives slot 3"),
])
def test_a_slot_layout_that_loses_rows_is_refused(slots, rank_slots, collect, message):
    with pytest.raises(ValueError, match=message):
        SlotLayout(slots, rank_slots, collect)


def test_a_layout_for_the_wrong_group_size_is_refused():
    name = f"fixed_{uuid.uuid4().hex[:6]}"
    register_dispatch_mode(name, slots=lambda layout: SlotLayout(1, (0,), (0,)))
    with pytest.raises(ValueError, match="layout of 1 ranks for a group of 3"):
        get_dispatch_mode(name).slot_layout(Layout(3))


def test_duplicate_mode_is_rejected():
    with pytest.raises(ValueError, match="'dp' is already registered"):
        register_dispatch_mode(DP, slots=lambda layout: None)


def test_unknown_mode_names_the_known_ones():
    with pytest.raises(ValueError, match="unknown dispatch mode 'dpp'.*'dp'"):
        get_dispatch_mode("dpp")


def test_metrics_of_uneven_shards_are_weighted_by_rows():
    from hybridflow.graph.dispatch import merge_metrics
    assert merge_metrics([{"m": 1.0}, {"m": 4.0}], [3, 1]) == {"m": 1.75}
    assert merge_metrics([{"m": 1.0}, {"m": 4.0}], [0, 0]) == {"m": 2.5}  # no rows: plain mean
