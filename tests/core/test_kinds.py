"""Typed node ops and kinds (hybridflow/core/kinds.py): strings convert on entry, members
compare and print as their strings, and each kind declares its row effect."""
from __future__ import annotations

import json

import pytest

from hybridflow.plan.compiler import PlanNode
from hybridflow.graph.dispatch import method, method_spec
from hybridflow.graph.builder import Graph
from hybridflow.core.kinds import NodeKind, Op, RowEffect


def test_members_equal_print_and_serialise_as_their_strings():
    assert NodeKind.TRAIN == "train" and f"{NodeKind.GENERATE:<9}|" == "generate |"
    assert str(Op.GATHER) == "gather" and json.dumps({"k": NodeKind.SOURCE}) == '{"k": "source"}'
    assert {"generate": 1}[NodeKind.GENERATE] == 1


@pytest.mark.parametrize("kind, effect", [
    (NodeKind.GENERATE, RowEffect.REPEATS), (NodeKind.INFERENCE, RowEffect.KEEPS),
    (NodeKind.TRAIN, RowEffect.KEEPS), (NodeKind.FUNCTION, RowEffect.KEEPS),
    (NodeKind.SOURCE, RowEffect.CHANGES)])
def test_each_kind_declares_what_it_does_to_rows(kind, effect):
    assert kind.row_effect is effect
    assert kind.row_effect.keeps_partition == (effect is RowEffect.KEEPS)


def test_plan_nodes_convert_strings_and_a_gather_gathers():
    node = PlanNode("g", "function", "gather", ("x",), "here")
    assert node.kind is NodeKind.FUNCTION and node.op is Op.GATHER
    assert node.row_effect is RowEffect.GATHERS
    assert PlanNode("gen", "generate", "call", (), "here").row_effect is RowEffect.REPEATS


def test_an_unknown_kind_names_the_allowed_ones():
    with pytest.raises(ValueError, match="node kind must be one of source, generate.*'call'"):
        PlanNode("n", "call", "call", (), "here")


def test_the_builder_keeps_taking_strings():
    class W:
        @method(kind="generate", writes=("r",))
        def go(self, batch): ...
    assert method_spec(W, "go").kind is NodeKind.GENERATE
    g = Graph("g")
    p = g.source("prompts")
    g.call("w.go", p)
    assert [n.op for n in g.nodes.values()] == [Op.SOURCE, Op.CALL]


def test_no_module_compares_a_node_kind_or_op_with_a_string():
    """The class stays fixed: hybridflow/ compares `.kind` / `.op` with the enums'
    members (or reads their declared properties), never with a literal string."""
    import pathlib
    import re
    root = pathlib.Path(__file__).resolve().parents[2] / "hybridflow"
    compare = re.compile(r"(\.(kind|op)|kinds\.get\([^)]*\))\s*(==|!=|(not\s+)?in\s*[({])\s*['\"]")
    found = [f"{path.relative_to(root)}:{n}" for path in sorted(root.rglob("*.py"))
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if compare.search(line.split("#")[0])]
    assert not found, f"compare with NodeKind / Op members instead: {found}"


def test_kinds_declare_what_they_do_and_the_planner_types_its_nodes():
    from hybridflow.planner.problem import NodeInfo, PlanningError
    assert [k for k in NodeKind if k.generates] == [NodeKind.GENERATE]
    assert [k for k in NodeKind if k.trains] == [NodeKind.TRAIN]
    assert [k for k in NodeKind if k.moves_weights] == [NodeKind.SYNC]
    assert NodeInfo("load", "sync", "rollout", ("export",)).kind is NodeKind.SYNC
    with pytest.raises(PlanningError, match="node 'x' has kind 'call'; expected one of "
                       "source, generate, inference, train, function"):
        NodeInfo("x", "call", None, ())
