"""The planner weighs sequence parallelism (issue 38 item 3): a role whose one row does
not fit a device at sp=1 (a long response: a micro-batch holds whole rows) is planned
at the smallest sp that fits, from the sizes that divide the pool and the model's heads
and key/value heads; where rows fit, or the run cannot split them, every role stays at
sp=1. Plans are written as placement.parallel.<role>.sp."""
import pytest

from hybridflow.planner import Cluster, ModelSpec, Workload, plan_placement
from hybridflow.planner.cost import sp_sizes
from hybridflow.planner.search import NoFeasiblePlacement
from tests.planner.planner_graphs import grpo_graph

# Qwen2-0.5B's shapes: 14 heads, 2 key/value heads, a 152k vocabulary
QWEN_05B = ModelSpec("qwen2-0.5b", layers=24, hidden=896, heads=14, kv_heads=2,
                     intermediate=4864, vocab=151936, tied_embeddings=True)
TWO_A100_40G = Cluster(1, 2, "a100-40g")


def _work(response_len: int) -> Workload:
    return Workload(prompts=4, samples_per_prompt=2, prompt_len=256,
                    response_len=response_len, mini_batches=1)


def _plan(response_len: int, **kwargs):
    models = {"actor": QWEN_05B, "ref": QWEN_05B}
    return plan_placement(grpo_graph(), TWO_A100_40G, models, _work(response_len), **kwargs)


def test_a_row_that_does_not_fit_one_device_is_split_over_sp_ranks():
    result = _plan(32768)
    layouts = {r: lay for p in result.best.pools for r, lay in p.layouts.items()}
    assert layouts["actor"].sp == 2 and layouts["actor"].dp == 1
    parallel = result.best.to_placement_config()["parallel"]
    assert parallel["actor"] == {"dp": 1, "tp": 1, "sp": 2}
    assert all("sp" not in entry for role, entry in parallel.items() if layouts[role].sp == 1)
    assert "Sequence parallelism: actor at sp=2" in result.explain()
    # its memory: one row's activations halved fit where sp=1's did not
    pool = result.best.pool_of("actor")
    assert pool.memory.total <= pool.memory.usable


def test_without_sequence_parallelism_the_long_row_fits_nowhere():
    with pytest.raises(NoFeasiblePlacement, match="peak actor.update"):
        _plan(32768, sequence_parallel=False)


def test_rows_that_fit_keep_sp_1():
    for response_len in (4096, 16384):
        result = _plan(response_len)
        assert all(lay.sp == 1 for p in result.best.pools for lay in p.layouts.values())
        assert "Sequence parallelism" not in result.explain()


def test_sp_sizes_divide_the_pool_and_every_head_count_inside_a_node():
    node8 = Cluster(1, 8, "a100-80g")
    assert sp_sizes(node8, QWEN_05B, 8) == [2]  # 14 heads, 2 KV heads
    llama = ModelSpec("l", layers=2, hidden=768, heads=12, kv_heads=4, intermediate=64,
                      vocab=64)
    assert sp_sizes(node8, llama, 8) == [2, 4]
    assert sp_sizes(node8, llama, 6) == [2]  # 3 does not divide the 4 KV heads
    assert sp_sizes(Cluster(2, 2, "a100-80g"), llama, 4) == [2]  # not across nodes
