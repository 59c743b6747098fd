"""Search enumerates groupings, allocations and layouts, prunes soundly, and is fast."""
import itertools

import pytest
from planner_graphs import PAPER_WORKLOAD, SMALL_WORKLOAD, grpo_graph, ppo_graph, same_size

from hybridflow.planner import Cluster, ModelSpec, Workload, plan_placement
from hybridflow.planner.cost import CostModel, tp_options
from hybridflow.planner.pool import Shortfall, evaluate_pool
from hybridflow.planner.problem import build_problem
from hybridflow.planner.search import (allowed_pool_sizes, fits_on_nodes, make_candidate,
                                       set_partitions)


@pytest.mark.parametrize("n, bell", [(1, 1), (2, 2), (3, 5), (4, 15), (5, 52)])
def test_set_partitions_are_all_distinct_groupings(n, bell):
    items = tuple("abcde"[:n])
    parts = list(set_partitions(items))
    assert len(parts) == bell
    assert len({frozenset(frozenset(g) for g in p) for p in parts}) == bell
    assert parts[0] == (items,)  # everything colocated comes first


def test_allocations_use_whole_nodes_or_divisors_of_a_node():
    cluster = Cluster(2, 8, "a100-80g")
    assert allowed_pool_sizes(cluster) == [1, 2, 4, 8, 16]
    assert fits_on_nodes((8, 8), cluster) and fits_on_nodes((4, 4, 8), cluster)
    assert fits_on_nodes((4, 4, 4, 4, 8), Cluster(3, 8, "a100-80g"))  # 4+4 | 4+4 | 8
    assert not fits_on_nodes((4, 4, 4, 4, 8), Cluster(2, 8, "a100-80g"))  # needs a third node


def brute_force(graph, cluster, models, workload):
    """Every grouping x every allocation x every per-role tp, each simulated; no pruning or
    caching."""
    problem = build_problem(graph, cluster, models, workload)
    cost, roles = CostModel(problem), problem.placed_roles
    best_per_grouping = {}
    for labels in itertools.product(range(len(roles)), repeat=len(roles)):
        if any(labels[i] > max(labels[:i], default=-1) + 1 for i in range(len(labels))):
            continue  # not in canonical (restricted growth) form: a duplicate grouping
        groups = tuple(tuple(r for r, g in zip(roles, labels) if g == k)
                       for k in range(max(labels) + 1))
        for sizes in itertools.product(allowed_pool_sizes(cluster), repeat=len(groups)):
            if sum(sizes) != cluster.devices or not fits_on_nodes(sizes, cluster):
                continue
            tp_choices = [itertools.product(*(tp_options(cluster, models[r], n,
                                                         problem.generates(r)) for r in g))
                          for g, n in zip(groups, sizes)]
            for tps in itertools.product(*tp_choices):
                pools = tuple(evaluate_pool(cost, g, n, t) for g, n, t in zip(groups, sizes, tps))
                if any(isinstance(p, Shortfall) for p in pools):
                    continue
                step = make_candidate(problem, pools).step_seconds
                key = frozenset(groups)
                if step < best_per_grouping.get(key, float("inf")):
                    best_per_grouping[key] = step
    return sorted(best_per_grouping.values())


SMALL_CASES = [
    ("ppo 7b on 8 A100", ppo_graph(), Cluster(1, 8, "a100-80g"), same_size("7b"), PAPER_WORKLOAD),
    ("ppo 13b on 8 A100, memory-tight", ppo_graph(), Cluster(1, 8, "a100-80g"), same_size("13b"),
     PAPER_WORKLOAD),
    ("ppo 7b on 2x4 H100", ppo_graph(), Cluster(2, 4, "h100-80g"), same_size("7b"), PAPER_WORKLOAD),
    ("ppo 1.5b on 4 H200", ppo_graph(), Cluster(1, 4, "h200-141g"), same_size("1.5b"),
     SMALL_WORKLOAD),
    ("ppo mixed sizes on 8", ppo_graph(), Cluster(1, 8, "a100-80g"),
     {"actor": ModelSpec.from_name("13b"), "ref": ModelSpec.from_name("13b"),
      "critic": ModelSpec.from_name("3b")},
     PAPER_WORKLOAD),
    ("reward model, rule-free ref", ppo_graph(), Cluster(4, 2, "a100-80g"),
     same_size("7b", ("actor", "critic", "reward")), SMALL_WORKLOAD),
    ("grpo 7b on 2x2", grpo_graph(), Cluster(2, 2, "h100-80g"), same_size("7b", ("actor", "ref")),
     SMALL_WORKLOAD),
    ("ppo 0.5b on 4 cpus", ppo_graph(), Cluster(1, 4, "cpu"), same_size("0.5b"),
     Workload(8, 2, 64, 64, micro_batch_tokens=512)),
]


@pytest.mark.parametrize("label, graph, cluster, models, workload", SMALL_CASES,
                         ids=[c[0] for c in SMALL_CASES])
def test_search_agrees_with_brute_force(label, graph, cluster, models, workload):
    expected = brute_force(graph, cluster, models, workload)
    result = plan_placement(graph, cluster, models, workload, top_k=3)
    assert result.best.step_seconds == pytest.approx(expected[0], rel=1e-9)
    # runners-up are the next best groupings, each at its own best allocation and layout
    assert [c.step_seconds for c in result.ranked] == pytest.approx(expected[:3], rel=1e-9)


def test_pruning_is_exact_on_a_larger_space():
    """4 roles on 32 devices: still equal to exhaustive enumeration."""
    graph, cluster = ppo_graph(), Cluster(4, 8, "h100-80g")
    models = same_size("7b", ("actor", "ref", "critic", "reward"))
    expected = brute_force(graph, cluster, models, SMALL_WORKLOAD)
    result = plan_placement(graph, cluster, models, SMALL_WORKLOAD, top_k=4)
    assert [c.step_seconds for c in result.ranked] == pytest.approx(expected[:4], rel=1e-9)


def test_five_roles_on_128_devices_are_planned_by_simulating_few_plans():
    """Pruning, counted in plans simulated (deterministic); the search's seconds are
    bench/planner.py's figure, not an assertion."""
    graph = ppo_graph(extra_scores=("cost",))
    models = same_size("13b", ("actor", "ref", "critic", "reward", "cost"))
    result = plan_placement(graph, Cluster(16, 8, "a100-80g"), models, PAPER_WORKLOAD)
    assert sum(p.devices for p in result.best.pools) == 128
    assert 0 < result.plans_simulated < 100


def test_runners_up_are_ranked_and_say_why_they_lost():
    result = plan_placement(ppo_graph(), Cluster(2, 8, "a100-80g"), same_size("7b"), PAPER_WORKLOAD,
                            top_k=4)
    steps = [c.step_seconds for c in result.ranked]
    assert steps == sorted(steps) and len(result.candidates) == 3
    assert len({c.grouping for c in result.ranked}) == 4  # one plan per grouping
    for runner_up in result.candidates:
        assert "slower than the best" in runner_up.reason
        assert runner_up.node_seconds and runner_up.pools[0].memory.total > 0
    assert result.best.reason == ""
