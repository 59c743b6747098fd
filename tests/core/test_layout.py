"""A role's layout in one object (core/layout.py): its sizes, each rank's coordinates
and groups, and the checks with messages naming role, key and numbers; the placement
derives it, parses `sp`, and lays out the mesh ((dp x sp, tp), tp innermost)."""
from __future__ import annotations

import pytest

from hybridflow.core.layout import Coords, RoleLayout, refuse_not_tensor_parallel
from hybridflow.graph.dispatch import Layout
from hybridflow.plan.placement import Placement, PoolSpec


def test_sizes_coordinates_and_groups_of_dp_2_by_tp_3():
    layout = RoleLayout(6, 3, role="actor")
    assert (layout.dp, layout.tp, layout.sp, layout.world) == (2, 3, 1, 6)
    assert [layout.coords(r) for r in range(6)] == [
        Coords(0, 0, 0), Coords(0, 0, 1), Coords(0, 0, 2),
        Coords(1, 0, 0), Coords(1, 0, 1), Coords(1, 0, 2)]
    assert layout.tp_groups == ((0, 1, 2), (3, 4, 5))  # consecutive ranks: one shard set
    assert layout.dp_groups == ((0, 3), (1, 4), (2, 5))  # same shard: gradients reduce
    assert [layout.leader(r) for r in range(6)] == [0, 0, 0, 3, 3, 3]
    assert layout.row_group(1) == (3, 4, 5)
    assert layout.describe() == "dp 2 × tp 3" and layout.sharded


def test_tp_one_is_plain_data_parallel():
    layout = RoleLayout(4)
    assert layout.dp == 4 and not layout.sharded and layout.describe() == "dp 4"
    assert layout.tp_groups == ((0,), (1,), (2,), (3,))
    assert layout.dp_groups == ((0, 1, 2, 3),)


def test_the_dispatch_layout_is_the_role_layout_under_its_old_names():
    old = Layout(world_size=6, tp_size=2)
    assert isinstance(old, RoleLayout)
    assert (old.world_size, old.tp_size, old.dp_size) == (6, 2, 3)


def test_tp_not_dividing_the_pool_names_role_key_numbers_and_allowed_sizes():
    with pytest.raises(ValueError, match=r"placement\.parallel\.critic\.tp=4: role 'critic' "
                                         r"has tensor-parallel size 4, which does not divide "
                                         r"the 6 device\(s\) of its pool 'main'.*"
                                         r"allows: \[1, 2, 3, 6\]"):
        RoleLayout(6, 4, role="critic", pool="main")


def test_a_rank_outside_the_layout_is_refused():
    with pytest.raises(ValueError, match="rank 4 is outside role 'actor''s 4 ranks"):
        RoleLayout(4, 2, role="actor").coords(4)


def test_tp_must_divide_the_heads_and_the_message_lists_what_the_model_allows():
    RoleLayout(4, 2, role="actor").check_heads(8, 2)
    with pytest.raises(ValueError, match=r"placement\.parallel\.actor\.tp=4 does not divide "
                                         r"the model's num_key_value_heads=2.*allows: \[1, 2\]"):
        RoleLayout(4, 4, role="actor").check_heads(8, 2)


def test_a_strategy_without_tensor_parallelism_is_refused_naming_key_and_alternatives():
    with pytest.raises(ValueError, match=r"placement\.parallel\.actor\.tp=2: training strategy "
                                         r"actor\.strategy='ddp' does not shard by tensor "
                                         r"parallelism; use one that does \(fsdp2\) or tp=1"):
        refuse_not_tensor_parallel("training strategy", "actor.strategy", "ddp", ["fsdp2"],
                                   role="actor", tp=2)


def test_the_placement_derives_each_roles_layout_once():
    placement = Placement({"main": PoolSpec("main", 1, 4), "gen": PoolSpec("gen", 1, 2)},
                          {"actor": "main", "rollout": "gen", "ref": "main"},
                          {"actor": {"tp": 2}}, folded={"ref": "actor"})
    assert placement.layout("actor") == RoleLayout(4, 2)
    assert placement.layout("rollout") == RoleLayout(2, 1)
    assert placement.layout("ref").tp == 2  # a folded role runs on its host's layout
    assert placement.layout("actor", world=2).dp == 1  # the runtime's count of the pool
    assert placement.layout_lines(["actor", "rollout"]) == [
        "  layout: actor on pool main: dp 2 x sp 1 x tp 2, tp groups [[0, 1], [2, 3]]"]


def test_sp_is_parsed_and_sp_1_accepted():
    cfg = {"pools": {"main": {"devices_per_node": 2}}, "roles": {"actor": "main"},
           "parallel": {"actor": {"tp": 2, "sp": 1}}}
    assert Placement.from_config(cfg).layout("actor") == RoleLayout(2, 2)


def test_sp_2_splits_rows_and_generation_ignores_it():
    cfg = {"pools": {"main": {"devices_per_node": 4}}, "roles": {"actor": "main"},
           "parallel": {"actor": {"sp": 2}}}
    layout = Placement.from_config(cfg).layout("actor")
    assert (layout.dp, layout.sp, layout.tp) == (2, 2, 1)
    assert layout.row_group(1) == (2, 3) and layout.sp_groups == ((0, 1), (2, 3))
    assert layout.describe() == "dp 2 × sp 2"
    generating = Placement.from_config(cfg).layout("actor", generating=True)
    assert (generating.dp, generating.sp) == (4, 1)


def test_sp_groups_under_tp_are_strided_by_tp():
    assert RoleLayout(8, 2, 2).sp_groups == ((0, 2), (1, 3), (4, 6), (5, 7))


def test_the_mesh_flattens_dp_and_sp_the_ranks_parameters_replicate_over():
    layout = RoleLayout(8, tp=2, sp=2)
    assert (layout.mesh_shape, layout.replica_dim) == ((4, 2), "dp_sp")
    # the (dp x sp, tp) grid in rank order: its rows are the tp groups, and each sp
    # group lies in one column (the ranks holding one shard, a gradient's group)
    grid = [list(range(r * 2, r * 2 + 2)) for r in range(4)]
    assert [tuple(row) for row in grid] == list(layout.tp_groups)
    columns = [{row[t] for row in grid} for t in range(2)]
    assert all(any(set(sp) <= column for column in columns) for sp in layout.sp_groups)
    assert (RoleLayout(4, tp=2).mesh_shape, RoleLayout(4, tp=2).replica_dim) == ((2, 2), "dp")


@pytest.mark.parametrize("sp", [0, -1])
def test_sp_below_1_or_not_a_number_is_refused(sp):
    cfg = {"pools": {"main": {"devices_per_node": 4}}, "roles": {"actor": "main"},
           "parallel": {"actor": {"sp": sp}}}
    with pytest.raises(ValueError, match=r"placement\.parallel\.actor\.sp=.*whole number"):
        Placement.from_config(cfg)


def test_sp_x_tp_not_dividing_the_pool_names_the_sizes():
    with pytest.raises(ValueError, match=r"placement\.parallel\.actor\.sp=2: .*sp x tp = 4 "
                                         r".*6 device.*allows: \[1, 2, 3, 6\]"):
        RoleLayout(6, 2, 2, role="actor")
