"""Reshard planning of a group function: groups split across shards are regrouped
when their rows are contiguous (concatenating the chunks gives the rows back in
order), and refused, naming the node, when they are not (the output would come back
in another order than the other inputs of its consumers)."""
import numpy as np
import pytest

from hybridflow.plan.compiler import PlanNode
from hybridflow.runtime.common import NodeFailure
from hybridflow.runtime.outputs import NodeOutput
from hybridflow.runtime.reshard import grouped_inputs

NODE = PlanNode("advantages", "function", "fn", ("generate",), "graph.py:9", group_by="uid")


def shards(*uids) -> NodeOutput:
    groups = [{"uid": np.array(u, dtype=np.uint64)} for u in uids]
    return NodeOutput("generate", [f"ref{i}" for i in range(len(uids))],
                      [("pool", i) for i in range(len(uids))], "generate",
                      rows=[len(u) for u in uids], keys=["uid"], groups=groups)


def test_contiguous_groups_split_across_shards_are_regrouped_in_order():
    inputs, lineage = grouped_inputs(NODE, [shards([1, 1, 2], [2, 3, 3])], 2)
    first, second = inputs[0]["generate"], inputs[1]["generate"]
    # slot 0: groups 1 and 2 = rows 0-2 of shard 0 and row 0 of shard 1, in order;
    # slot 1: group 3 = rows 1-2 of shard 1
    assert [p.arg for p in first.pieces] == ["ref0", "ref1"]
    assert list(first.index) == [0, 1, 2, 3]
    assert [p.arg for p in second.pieces] == ["ref1"] and list(second.index) == [1, 2]
    assert lineage == "advantages"


def test_groups_whose_rows_are_apart_are_refused_naming_the_node():
    with pytest.raises(NodeFailure, match=r"(?s)node 'advantages'.*'uid' group are not next"):
        grouped_inputs(NODE, [shards([1, 2, 1], [3, 2, 3])], 2)


def test_whole_groups_per_shard_run_as_they_are():
    inputs, _ = grouped_inputs(NODE, [shards([1, 2, 1], [3, 3])], 2)
    assert all(inputs[s]["generate"].index is None for s in range(2))
