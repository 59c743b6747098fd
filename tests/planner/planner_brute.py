"""The planner's search checked against every plan: a brute force shared by the
pipelined and streaming search tests (test modules do not import each other)."""
import itertools

from hybridflow.planner.cost import CostModel, tp_options
from hybridflow.planner.pool import Shortfall, evaluate_pool
from hybridflow.planner.search import allowed_pool_sizes, fits_on_nodes, make_candidate


def brute_force_best(problem) -> float:
    """Every grouping x allocation x tp of a problem, pipelined, no pruning."""
    cost, roles, cluster = CostModel(problem), problem.placed_roles, problem.cluster
    best = float("inf")
    for labels in itertools.product(range(len(roles)), repeat=len(roles)):
        if any(labels[i] > max(labels[:i], default=-1) + 1 for i in range(len(labels))):
            continue
        groups = tuple(tuple(r for r, g in zip(roles, labels) if g == k)
                       for k in range(max(labels) + 1))
        group_of = {r: i for i, g in enumerate(groups) for r in g}
        if any(group_of[r] == group_of[h] for r, h in problem.own_weights.items()):
            continue
        for sizes in itertools.product(allowed_pool_sizes(cluster), repeat=len(groups)):
            if sum(sizes) != cluster.devices or not fits_on_nodes(sizes, cluster):
                continue
            choices = [itertools.product(*(tp_options(cluster, problem.models[r], n,
                                                      problem.generates(r)) for r in g))
                       for g, n in zip(groups, sizes)]
            for tps in itertools.product(*choices):
                pools = tuple(evaluate_pool(cost, g, n, t) for g, n, t in zip(groups, sizes, tps))
                if not any(isinstance(p, Shortfall) for p in pools):
                    best = min(best, make_candidate(problem, pools).step_seconds)
    return best
