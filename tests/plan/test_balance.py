"""`trainer.balance_batch`: generated rows reordered so that each data-parallel
rank's contiguous chunk holds a near-equal share of the tokens; the reordered rows
train as the original ones do, on the local runtime and on Ray with the actor on two
data-parallel ranks."""
import random

import pytest
import torch

from hybridflow.plan.balance import (balance_tokens, balanced_order, chunk_sizes,
                                     insert_token_balance)
from hybridflow.core.batch import Batch
from hybridflow.program.assemble import prepare
from tests.support.e2e import graph_file, train
from tests.support.runs import FAST

REF_ON_TWO = ("placement.pools.refpool.devices_per_node=2", "placement.roles.ref=refpool")
# Per runtime: the runs' overrides and the metrics the two orders must agree on.
# Local: one mini-batch, whose loss is a token mean over the whole batch, so reordering
# its rows changes nothing but the order of a float sum. Ray: the actor on two ranks
# and a loss that is a mean over sequences; both orders give each rank the same number
# of them, so any misaligned row (an advantage paired with another sample) would
# change the gradient.
SAME_TRAINING = {
    "local": (("trainer.steps=2", *FAST, *REF_ON_TWO),
              ("critic/score/mean", "actor/pg_loss", "actor/kl_loss", "response_length/mean")),
    "ray": (("runtime.name=ray", "runtime.torch_threads=1", "trainer.steps=2",
             "trainer.val_every=0", "data.batch_size=8", "rollout.n=4",
             "actor.mini_batch_size=32", "actor.micro_batch_size=16",
             "placement.pools.main.devices_per_node=2", "actor.loss_agg_mode=seq-mean-token-mean"),
            ("critic/score/mean", "actor/pg_loss", "actor/grad_norm", "response_length/mean")),
}


def chunk_totals(lengths, parts):
    totals, start = [], 0
    for size in chunk_sizes(len(lengths), parts):
        totals.append(sum(lengths[start:start + size]))
        start += size
    return totals


@pytest.mark.parametrize("rows,parts", [(32, 2), (30, 4), (7, 3), (5, 8)])
def test_balanced_order_keeps_row_counts_and_evens_tokens(rows, parts):
    rng = random.Random(rows * parts)
    lengths = sorted(int(rng.lognormvariate(4, 1)) + 1 for _ in range(rows))  # worst case
    order = balanced_order(lengths, parts)
    assert sorted(order) == list(range(rows))  # a permutation
    before, after = chunk_totals(lengths, parts), chunk_totals([lengths[i] for i in order],
                                                                parts)
    assert max(after) - min(after) <= max(lengths)  # within one row of even
    assert max(after) - min(after) <= max(before) - min(before)


def test_groups_move_whole_and_stay_contiguous():
    lengths = [50, 50, 1, 1, 40, 40, 2, 2, 30, 30, 3, 3]
    groups = ["a", "a", "b", "b", "c", "c", "d", "d", "e", "e", "f", "f"]
    order = balanced_order(lengths, 2, groups)
    ordered = [groups[i] for i in order]
    runs = [g for i, g in enumerate(ordered) if i == 0 or g != ordered[i - 1]]
    assert sorted(runs) == sorted(set(groups))  # each group one contiguous run
    totals = chunk_totals([lengths[i] for i in order], 2)
    assert max(totals) - min(totals) < max(chunk_totals(lengths, 2)) - min(
        chunk_totals(lengths, 2))


def test_balance_tokens_permutes_every_column_together():
    mask = torch.zeros(6, 8, dtype=torch.long)
    for row, n in enumerate([8, 7, 6, 1, 1, 1]):
        mask[row, :n] = 1
    batch = Batch({"attention_mask": mask, "ids": torch.arange(6)},
                  {"uid": [f"u{i}" for i in range(6)]})
    out = balance_tokens(batch, parts=2)
    assert [f"u{i}" for i in out["ids"].tolist()] == list(out["uid"])
    metrics = out.meta["metrics"]
    assert metrics["balance/token_spread_before"] == pytest.approx(18 / 12)  # 21 vs 3
    assert metrics["balance/token_spread_after"] == pytest.approx(4 / 12)  # 10 vs 14: best


def test_the_plan_gets_a_balance_node_only_where_ranks_share_a_batch():
    plan = prepare(graph_file("grpo"), ["trainer.balance_batch=true", *REF_ON_TWO],
                   preflight=False).plan
    node = plan.node("balance_tokens")
    assert node.deps == ("rollout.generate",) and node.kwargs == {"parts": 2}
    readers = [n.name for n in plan.nodes if "balance_tokens" in n.deps]
    assert set(readers) == {"actor.logprob", "ref.logprob", "reward.score",
                            "grpo_advantages", "actor.update"}
    assert not any("rollout.generate" in n.deps for n in plan.nodes
                   if n.name != "balance_tokens")
    one_rank = prepare(graph_file("grpo"), ["trainer.balance_batch=true"],
                       preflight=False).plan
    assert insert_token_balance(one_rank) is one_rank  # nothing to balance
    assert "balance_tokens" not in [n.name for n in one_rank.nodes]


def test_balanced_training_sees_the_same_samples(tmp_path, runtime_name):
    args, keys = SAME_TRAINING[runtime_name]
    _, plain = train("grpo", tmp_path / "plain", *args)
    _, balanced = train("grpo", tmp_path / "balanced", *args, "trainer.balance_batch=true")
    for a, b in zip(plain, balanced):
        for key in keys:
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), key
        assert b["balance/token_spread_after"] <= b["balance/token_spread_before"]
    assert any(m["balance/token_spread_after"] < m["balance/token_spread_before"]
               for m in balanced)  # rows did move
