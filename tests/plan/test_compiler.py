"""Compiler (hybridflow/plan/compiler.py): every malformed graph is rejected before any
worker starts, with the node's name, the key, a suggestion and the file:line where
the node was made; valid graphs lower to a topological order, stages and key
provenance."""
from __future__ import annotations

import inspect
import uuid

import pytest

from hybridflow.plan.compiler import ExecutionPlan, GraphError, compile_graph
from hybridflow.graph.dispatch import DP, ONE_PER_WORKER, RANK_ZERO, method
from hybridflow.graph.builder import Graph, node_fn
from hybridflow.core.kinds import NodeKind, Op, RowEffect
from hybridflow.plan.placement import Placement, PoolSpec

SEQ = ("input_ids", "attention_mask")


# --------------------------------------------------------------- fake workers
class Actor:
    @method(dispatch=DP, reads=SEQ, writes=("responses", "response_mask") + SEQ,
            kind="generate", overwrites=SEQ, forwards=True)
    def generate(self, batch, n=1, temperature=1.0): ...

    @method(dispatch=DP, reads=SEQ + ("responses",), writes=("old_log_probs",))
    def logprob(self, batch, micro_batch_size=8): ...

    @method(dispatch=DP, reads=SEQ + ("responses", "response_mask", "old_log_probs",
                                      "advantages"),
            optional=("ref_log_prob",), writes=("actor_metrics",), kind="train")
    def update(self, batch, epochs=1): ...


class Ref:
    @method(dispatch=DP, reads=SEQ + ("responses",), writes=("ref_log_prob",))
    def logprob(self, batch): ...


class Reward:
    @method(dispatch=RANK_ZERO, reads=("responses", "ground_truth"), writes=("scores",))
    def score(self, batch, **options): ...


class Critic:
    @method(dispatch=DP, reads=SEQ + ("responses",), writes=("values",))
    def values(self, batch): ...


@node_fn(reads=("scores", "uid", "response_mask"), writes=("advantages",), group_by="uid")
def group_advantages(batch, epsilon=1e-6): ...


@node_fn(reads=("scores", "response_mask"), writes=("advantages",))
def plain_advantages(batch): ...


@node_fn(reads=("responses",), writes=("responses",), overwrites=("responses",))
def truncate(batch): ...


def undeclared(batch): ...


BINDINGS = {"actor": Actor, "ref": Ref, "reward": Reward, "critic": Critic}


def here() -> str:
    """`test_compiler.py:<line>` of the caller: where a node on that line was made."""
    return f"test_compiler.py:{inspect.currentframe().f_back.f_lineno}"


def compile_(g: Graph, bindings=None, placement=None) -> ExecutionPlan:
    bindings = BINDINGS if bindings is None else bindings
    return compile_graph(g, bindings, placement or Placement.single_pool(bindings))


def rejected(g: Graph, *words: str, **kw) -> str:
    """Compile `g`, expect a GraphError, and check the message has every word."""
    with pytest.raises(GraphError) as err:
        compile_(g, **kw)
    message = str(err.value)
    for word in words:
        assert word in message, f"{word!r} not in:\n{message}"
    return message


def grpo_graph(g: Graph | None = None):
    g = g or Graph("grpo")
    prompts = g.source("prompts")
    rollout = g.call("actor.generate", prompts, n=4)
    old = g.call("actor.logprob", rollout)
    ref = g.call("ref.logprob", rollout)
    score = g.call("reward.score", rollout)
    adv = g.fn(group_advantages, rollout, score)
    g.call("actor.update", rollout, old, ref, adv)
    return g


# ==================================================================== rejected
def test_cycle_through_string_inputs_prints_the_cycle():
    g = Graph("loop")
    prompts = g.source()
    first, loc = g.call("actor.generate", prompts, "reward.score"), here()
    g.call("reward.score", first)
    rejected(g, "cycle", "actor.generate -> reward.score -> actor.generate",
             "node 'actor.generate'", loc)


def test_node_that_reads_itself_is_a_cycle():
    g = Graph("self")
    g.source()
    _, loc = g.call("actor.logprob", "prompts", "actor.logprob"), here()
    rejected(g, "cycle", "actor.logprob -> actor.logprob", loc)


def test_missing_key_names_key_node_and_writer():
    g = Graph("g")
    prompts = g.source()
    g.call("actor.generate", prompts)
    _, loc = g.call("actor.logprob", prompts), here()
    rejected(g, "node 'actor.logprob'", loc, "reads key 'responses'",
             "none of its inputs ('prompts')", "written by ['actor.generate']",
             "pass that node as an input")


def test_missing_key_nobody_writes_suggests_a_close_key():
    @node_fn(reads=("respones",), writes=("lengths",))
    def lengths(batch): ...

    g = Graph("g")
    rollout = g.call("actor.generate", g.source())
    _, loc = g.fn(lengths, rollout), here()
    rejected(g, "node 'lengths'", loc, "reads key 'respones'", "did you mean 'responses'")


def test_key_from_two_writers_reaching_one_node():
    g = Graph("g")
    rollout = g.call("actor.generate", g.source())
    score = g.call("reward.score", rollout)
    a = g.fn(plain_advantages, rollout, score, name="adv_a")
    b = g.fn(plain_advantages, rollout, score, name="adv_b")
    old = g.call("actor.logprob", rollout)
    _, loc = g.call("actor.update", rollout, old, a, b), here()
    rejected(g, "node 'actor.update'", loc, "key 'advantages' reaches it from two writers",
             "'adv_a' and 'adv_b'", "rename")


def test_a_downstream_writer_that_never_saw_the_key_is_a_second_writer():
    @node_fn(reads=("scores",), writes=("old_log_probs",))
    def fake_old(batch): ...

    g = Graph("g")
    rollout = g.call("actor.generate", g.source())
    old = g.call("actor.logprob", rollout)
    score = g.call("reward.score", rollout, old)  # old's key stops here: no forwarding
    fake = g.fn(fake_old, score)                   # downstream of old, but never saw it
    adv = g.fn(plain_advantages, rollout, score)
    _, loc = g.call("actor.update", rollout, old, fake, adv), here()
    rejected(g, "node 'actor.update'", loc, "key 'old_log_probs' reaches it from two writers",
             "'actor.logprob' and 'fake_old'")


def test_writing_a_key_already_in_the_input_needs_overwrites():
    @node_fn(reads=("responses",), writes=("responses", "lengths"))
    def clip(batch): ...

    g = Graph("g")
    rollout = g.call("actor.generate", g.source())
    _, loc = g.fn(clip, rollout), here()
    rejected(g, "node 'clip'", loc, "writes key 'responses'",
             "already reaches it from node 'actor.generate'", "overwrites=('responses',)")


def test_unknown_role_suggests_the_closest():
    g = Graph("g")
    _, loc = g.call("actr.generate", g.source()), here()
    rejected(g, "node 'actr.generate'", loc, "unknown role 'actr'", "did you mean 'actor'")


def test_unknown_method_suggests_the_closest():
    g = Graph("g")
    _, loc = g.call("actor.genrate", g.source()), here()
    rejected(g, "node 'actor.genrate'", loc, "has no method 'genrate'",
             "did you mean 'generate'", "Actor")


def test_unexpected_kwarg_on_a_method_suggests_the_closest():
    g = Graph("g")
    _, loc = g.call("actor.generate", g.source(), n=2, temprature=0.7), here()
    rejected(g, "node 'actor.generate'", loc, "does not accept argument 'temprature'",
             "did you mean 'temperature'")


def test_unexpected_kwarg_on_a_function_suggests_the_closest():
    g = Graph("g")
    rollout = g.call("actor.generate", g.source())
    score = g.call("reward.score", rollout)
    _, loc = g.fn(group_advantages, rollout, score, epsilo=0.1), here()
    rejected(g, "node 'group_advantages'", loc, "does not accept argument 'epsilo'",
             "did you mean 'epsilon'")


def test_role_with_no_pool():
    g = Graph("g")
    _, loc = g.call("actor.generate", g.source()), here()
    placement = Placement({"main": PoolSpec("main")}, {"ref": "main"})
    rejected(g, "node 'actor.generate'", loc, "role 'actor' has no pool",
             "placement.roles", "['main']", placement=placement)


def test_pool_not_defined_suggests_the_closest():
    g = Graph("g")
    _, loc = g.call("actor.generate", g.source()), here()
    placement = Placement({"rollout": PoolSpec("rollout", 1, 2)}, {"actor": "rolout"})
    rejected(g, loc, "pool 'rolout', which is not defined", "did you mean 'rollout'",
             placement=placement)


def test_pool_with_zero_devices():
    g = Graph("g")
    _, loc = g.call("actor.generate", g.source()), here()
    placement = Placement({"main": PoolSpec("main", 1, 0)}, {"actor": "main"})
    rejected(g, "node 'actor.generate'", loc, "pool 'main' of role 'actor' has no devices",
             placement=placement)


def test_tensor_parallel_size_must_divide_the_pool():
    g = Graph("g")
    _, loc = g.call("actor.generate", g.source()), here()
    placement = Placement({"main": PoolSpec("main", 1, 6)}, {"actor": "main"},
                          {"actor": {"tp": 4}})
    rejected(g, loc, "tensor-parallel size 4", "6 device(s)", placement=placement)


def test_function_without_node_fn_declaration():
    g = Graph("g")
    _, loc = g.fn(undeclared, g.source()), here()
    rejected(g, "node 'undeclared'", loc, "no @node_fn(reads=..., writes=...)")


def test_fn_of_something_not_callable():
    g = Graph("g")
    _, loc = g.fn("group_advantages", g.source(), name="adv"), here()
    rejected(g, "node 'adv'", loc, "@node_fn")


def test_group_by_key_missing_from_the_input():
    g = Graph("g")
    rollout = g.call("actor.generate", g.source(keys=SEQ + ("ground_truth", "uid")))
    score = g.call("reward.score", rollout)
    _, loc = g.fn(plain_advantages, rollout, score, group_by="prompt_id"), here()
    rejected(g, "node 'plain_advantages'", loc, "group_by key 'prompt_id'",
             "not in its input")


def test_input_that_is_not_a_node_handle():
    g = Graph("g")
    _, loc = g.call("actor.generate", {"input_ids": 1}), here()
    rejected(g, loc, "is not a node handle", "pass the value returned by source/call/fn")


def test_input_from_another_graph():
    other = Graph("other")
    foreign = other.source("theirs")
    g = Graph("mine")
    _, loc = g.call("actor.generate", foreign), here()
    rejected(g, loc, "input 'theirs' belongs to another graph ('other')")


def test_duplicate_node_names():
    g = Graph("g")
    prompts = g.source()
    rollout = g.call("actor.generate", prompts)
    g.call("actor.logprob", rollout)
    _, second = g.call("actor.logprob", rollout), here()
    message = rejected(g, "node name 'actor.logprob' is already used", second,
                       "pass name='...'")
    assert message.count("already used") == 1


def test_call_target_without_a_dot():
    g = Graph("g")
    _, loc = g.call("generate", g.source()), here()
    rejected(g, loc, "call target 'generate' must be 'role.method'")


@pytest.mark.parametrize("target", ["actor.", ".generate"])
def test_call_target_with_an_empty_half(target):
    g = Graph("g")
    _, loc = g.call(target, g.source()), here()
    rejected(g, loc, f"call target {target!r} must be 'role.method'")


def test_unknown_input_name_suggests_the_closest():
    g = Graph("g")
    g.call("actor.generate", g.source())
    _, loc = g.call("actor.logprob", "actor.generat"), here()
    rejected(g, "node 'actor.logprob'", loc, "input 'actor.generat' is not a node",
             "did you mean 'actor.generate'")


def test_rename_of_a_key_the_node_does_not_write():
    g = Graph("g")
    rollout = g.call("actor.generate", g.source())
    _, loc = g.call("ref.logprob", rollout, rename={"ref_logprob": "base"}), here()
    rejected(g, "node 'ref.logprob'", loc, "rename of 'ref_logprob'",
             "it writes ['ref_log_prob']")


def test_unknown_dispatch_mode():
    class Odd:
        @method(dispatch="scatter_gather")
        def run(self, batch): ...

    g = Graph("g")
    _, loc = g.call("odd.run", g.source()), here()
    rejected(g, "node 'odd.run'", loc, "unknown dispatch mode 'scatter_gather'",
             bindings={**BINDINGS, "odd": Odd})


def test_a_mode_that_takes_one_value_per_rank_is_not_a_graph_node():
    class PerRank:
        @method(dispatch=ONE_PER_WORKER)
        def run(self, batch): ...

    g = Graph("g")
    _, loc = g.call("per.run", g.source()), here()
    rejected(g, "node 'per.run'", loc, "dispatch mode 'one_per_worker'",
             "one value per rank", "call_role", bindings={**BINDINGS, "per": PerRank})


def test_plan_nodes_carry_typed_ops_kinds_and_row_effects():
    plan = compile_(grpo_graph())
    kinds = {n.name: (n.op, n.kind, n.row_effect) for n in plan.nodes}
    assert kinds["prompts"] == (Op.SOURCE, NodeKind.SOURCE, RowEffect.CHANGES)
    assert kinds["actor.generate"] == (Op.CALL, NodeKind.GENERATE, RowEffect.REPEATS)
    assert kinds["actor.update"] == (Op.CALL, NodeKind.TRAIN, RowEffect.KEEPS)
    assert kinds["group_advantages"][:2] == (Op.FN, NodeKind.FUNCTION)


def test_every_problem_is_reported_at_once():
    g = Graph("g")
    prompts = g.source()
    _, loc1 = g.call("actor.genrate", prompts), here()
    _, loc2 = g.call("reward.scor", prompts), here()
    message = rejected(g, "2 problem(s)", loc1, loc2, "'generate'", "'score'")
    assert "genrate" in message and "scor'" in message


def test_the_location_is_the_users_file_not_the_engine():
    g = Graph("g")
    message = rejected(g.call("actor.nope", g.source()).graph, "(test_compiler.py:")
    assert "(graph.py:" not in message and "(compiler.py:" not in message


# ==================================================================== warnings
def test_warns_when_no_node_trains():
    g = Graph("g")
    rollout = g.call("actor.generate", g.source())
    g.call("reward.score", rollout)
    plan = compile_(g)
    assert any("no training node" in w for w in plan.warnings)


def test_warns_on_an_output_nothing_consumes():
    g = grpo_graph()
    _, loc = g.call("critic.values", "actor.generate"), here()
    plan = compile_(g)
    unused = [w for w in plan.warnings if "consumed by no node" in w]
    assert len(unused) == 1 and "node 'critic.values'" in unused[0] and loc in unused[0]
    assert not any("no training node" in w for w in plan.warnings)
    assert "warning:" in plan.summary()


def test_a_valid_grpo_graph_has_no_warnings():
    assert compile_(grpo_graph()).warnings == []


# ==================================================================== valid graphs
def test_topological_order_follows_string_inputs_defined_later():
    g = Graph("late")
    prompts = g.source()
    g.call("reward.score", "actor.generate")  # refers to a node made on the next line
    g.call("actor.generate", prompts)
    plan = compile_(g)
    names = [n.name for n in plan.nodes]
    assert names == ["prompts", "actor.generate", "reward.score"]
    assert plan.node("reward.score").deps == ("actor.generate",)
    assert plan.consumers("actor.generate") == ["reward.score"]


def test_order_keeps_definition_order_among_independent_nodes():
    plan = compile_(grpo_graph())
    assert [n.name for n in plan.nodes] == [
        "prompts", "actor.generate", "actor.logprob", "ref.logprob", "reward.score",
        "group_advantages", "actor.update"]


def test_plan_nodes_carry_kind_role_pool_dispatch_and_location():
    g = Graph("g")
    rollout, loc = g.call("actor.generate", g.source(), n=4), here()
    g.call("reward.score", rollout)
    plan = compile_(g)
    gen = plan.node("actor.generate")
    assert (gen.kind, gen.op, gen.role, gen.method, gen.pool, gen.dispatch) == \
        ("generate", "call", "actor", "generate", "main", DP)
    assert gen.kwargs == {"n": 4} and gen.location == loc and gen.forwards
    assert plan.node("reward.score").dispatch == RANK_ZERO
    assert plan.node("prompts").kind == "source" and plan.roles == ["actor", "reward"]
    assert plan.bindings["actor"] is Actor
    with pytest.raises(KeyError, match="no node 'nope'"):
        plan.node("nope")


def test_fn_node_takes_group_by_from_its_declaration_or_the_call():
    plan = compile_(grpo_graph())
    adv = plan.node("group_advantages")
    assert (adv.kind, adv.op, adv.pool, adv.group_by) == ("function", "fn", None, "uid")
    g = Graph("g")
    rollout = g.call("actor.generate", g.source())
    g.fn(plain_advantages, rollout, g.call("reward.score", rollout), group_by="uid")
    assert compile_(g).node("plain_advantages").group_by == "uid"


def test_independent_nodes_on_disjoint_pools_share_a_stage():
    placement = Placement({"train": PoolSpec("train", 1, 2), "ref": PoolSpec("ref"),
                           "rm": PoolSpec("rm")},
                          {"actor": "train", "ref": "ref", "reward": "rm", "critic": "train"})
    plan = compile_(grpo_graph(), placement=placement)
    assert plan.stages == [["prompts"], ["actor.generate"],
                           ["actor.logprob", "ref.logprob", "reward.score"],
                           ["group_advantages"], ["actor.update"]]
    assert "{actor.logprob, ref.logprob, reward.score}" in plan.summary()


def test_nodes_on_one_pool_do_not_share_a_stage():
    placement = Placement({"a": PoolSpec("a"), "b": PoolSpec("b")},
                          {"actor": "a", "ref": "a", "reward": "b", "critic": "a"})
    plan = compile_(grpo_graph(), placement=placement)
    together = next(s for s in plan.stages if "actor.logprob" in s)
    assert "ref.logprob" not in together and "reward.score" in together
    flat = [n for s in plan.stages for n in s]
    assert flat == [n.name for n in plan.nodes] or sorted(flat) == sorted(
        n.name for n in plan.nodes)
    position = {n: i for i, s in enumerate(plan.stages) for n in s}
    for node in plan.nodes:  # every stage comes after the stages of its inputs
        assert all(position[d] < position[node.name] for d in node.deps)


def test_driver_functions_share_a_stage_with_pool_nodes():
    @node_fn(reads=("responses",), writes=("lengths",))
    def lengths(batch): ...

    g = Graph("g")
    rollout = g.call("actor.generate", g.source())
    g.fn(lengths, rollout)
    g.call("actor.logprob", rollout)
    plan = compile_(g)
    assert ["lengths", "actor.logprob"] in plan.stages


def test_input_keys_record_provenance_through_forwards_and_overwrites():
    plan = compile_(grpo_graph())
    gen = plan.node("actor.generate")
    assert gen.output_keys["input_ids"] == "actor.generate"  # declared overwrite
    assert gen.output_keys["uid"] == "prompts"                # forwarded
    update = plan.node("actor.update")
    assert update.input_keys["input_ids"] == "actor.generate"
    assert update.input_keys["uid"] == "prompts"
    assert update.input_keys["old_log_probs"] == "actor.logprob"
    assert update.input_keys["ref_log_prob"] == "ref.logprob"
    assert update.input_keys["advantages"] == "group_advantages"
    assert plan.node("ref.logprob").output_keys == {"ref_log_prob": "ref.logprob"}


def test_a_later_writer_shadows_an_earlier_one_whatever_the_input_order():
    g = Graph("g")
    prompts = g.source()
    rollout = g.call("actor.generate", prompts)
    g.call("actor.logprob", prompts, rollout, name="a")  # source first
    g.call("actor.logprob", rollout, prompts, name="b")  # source last
    plan = compile_(g)
    assert plan.node("a").input_keys["input_ids"] == "actor.generate"
    assert plan.node("b").input_keys["input_ids"] == "actor.generate"


def test_a_chain_of_overwrites_shadows_the_first_writer():
    @node_fn(reads=("responses",), writes=("responses",), overwrites=("responses",))
    def again(batch): ...

    g = Graph("g")
    rollout = g.call("actor.generate", g.source())
    twice = g.fn(again, g.fn(truncate, rollout))
    g.call("actor.logprob", rollout, twice)
    assert compile_(g).node("actor.logprob").input_keys["responses"] == "again"


def test_declared_overwrite_is_accepted_and_wins_downstream():
    g = Graph("g")
    rollout = g.call("actor.generate", g.source())
    short = g.fn(truncate, rollout)
    g.call("actor.logprob", rollout, short)
    assert compile_(g).node("actor.logprob").input_keys["responses"] == "truncate"


def test_rename_keeps_two_writers_of_one_key_apart():
    g = Graph("g")
    rollout = g.call("actor.generate", g.source())
    base = g.call("ref.logprob", rollout, rename={"ref_log_prob": "base_log_prob"})
    ref = g.call("ref.logprob", rollout, name="ref2")
    adv = g.fn(plain_advantages, rollout, g.call("reward.score", rollout))
    old = g.call("actor.logprob", rollout)
    g.call("actor.update", rollout, old, ref, base, adv)
    plan = compile_(g)
    assert plan.node("ref.logprob").writes == ("base_log_prob",)
    assert plan.node("ref.logprob").rename == {"ref_log_prob": "base_log_prob"}
    update = plan.node("actor.update")
    assert update.input_keys["base_log_prob"] == "ref.logprob"
    assert update.input_keys["ref_log_prob"] == "ref2"


def test_renamed_overwrite_is_still_an_overwrite():
    g = Graph("g")
    g.call("actor.generate", g.source(), rename={"input_ids": "full_ids"})
    plan = compile_(g)
    assert "full_ids" in plan.node("actor.generate").writes


def test_methods_accepting_any_kwargs_take_any():
    g = Graph("g")
    rollout = g.call("actor.generate", g.source())
    g.call("reward.score", rollout, anything=1, goes="yes")
    assert compile_(g).node("reward.score").kwargs == {"anything": 1, "goes": "yes"}


def test_same_graph_compiles_under_two_placements():
    g = grpo_graph()
    one = compile_(g)
    two = compile_(g, placement=Placement({"p": PoolSpec("p", 2, 4)},
                                          {r: "p" for r in BINDINGS}))
    assert one.node("actor.update").pool == "main" and two.node("actor.update").pool == "p"


def test_summary_lists_nodes_pools_and_concurrency():
    text = compile_(grpo_graph()).summary()
    assert "graph 'grpo': 7 nodes" in text and "pool main: 1 device(s)" in text
    assert "concurrency:" in text and "actor@main [dp]" in text


def test_unique_graph_objects_do_not_leak_problems():
    name = f"g{uuid.uuid4().hex[:4]}"
    bad = Graph(name)
    bad.call("generate", bad.source())
    assert compile_(grpo_graph()).graph_name == "grpo"
