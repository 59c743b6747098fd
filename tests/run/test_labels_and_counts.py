"""Issue 26 class 14.

1. Labels: where `check` (and `render --plan`) say a function node runs is where the
   step scheduler runs it — compared with the run's own timeline for every shipped
   graph and for placements that move the first input to another pool or keep state.
2. Counts: every metric named `*_total` is summed when metrics of several parts are
   merged (data-parallel ranks, a gather's rounds, validation batches), every other
   metric is averaged — the one rule of `core.metric_names.is_summed`.
3. A documented look at a batch: `trainer.dump_batches=[...]` writes every node's
   output of those steps to RUN_DIR/batches/.
"""
from __future__ import annotations

import glob
import json
import os
import textwrap

import pytest

from hybridflow.agents.episodes import RolloutResult
from hybridflow.core.metric_names import is_summed
from hybridflow.graph.dispatch import merge_metrics
from hybridflow.plan.sites import fn_site, site_label
from hybridflow.program.assemble import prepare
from hybridflow.run.batch_dump import load_batch
from hybridflow.run.loop import Trainer
from hybridflow.run.tracking import new_run_dir
from hybridflow.runtime.common import sum_round_metrics
from tests.support.e2e import REPO

SHIPPED = sorted(os.path.splitext(os.path.basename(p))[0]
                 for p in glob.glob(os.path.join(REPO, "graphs", "*.py"))
                 if not os.path.basename(p).startswith(("_", "ops", "common")))
SMALL = ["trainer.steps=1", "trainer.val_every=0", "trainer.progress=false",
         "data.batch_size=4", "rollout.n=2", "actor.mini_batch_size=8"]
VARIANTS = {  # case -> (graph, extra overrides)
    **{name: (name, []) for name in SHIPPED},
    "ppo_adaptive_kl": ("ppo", ["algorithm.kl_target=0.1"]),      # a stateful fn: driver
    "grpo_reward_pool": ("grpo", ["placement.pools.rw.devices_per_node=2",
                                  "placement.roles.reward=rw"]),
    "ppo_critic_pool": ("ppo", ["placement.pools.crit.devices_per_node=1",
                                "placement.roles.critic=crit"]),
}


def _run(graph: str, tmp_path, *overrides: str):
    path = os.path.join(REPO, "graphs", f"{graph}.py")
    loaded = prepare(path, [f"trainer.runs_dir={tmp_path}", *SMALL, *overrides])
    run = new_run_dir(str(tmp_path), loaded.graph.name)
    trainer = Trainer(loaded, run)
    try:
        trainer.fit()
    finally:
        trainer.close()
    return loaded, run


def test_the_variants_cover_every_shipped_graph():
    assert {"grpo", "ppo", "dapo", "agent_grpo", "sft"} <= set(SHIPPED)


@pytest.mark.slow  # one training step per case (~5 s each)
@pytest.mark.parametrize("case", sorted(VARIANTS))
def test_the_label_of_every_function_node_is_where_it_ran(case, tmp_path):
    graph, overrides = VARIANTS[case]
    loaded, run = _run(graph, tmp_path, *overrides)
    records = [json.loads(line) for line in open(os.path.join(run.path, "timeline.jsonl"))]
    ran = {}
    for r in records:
        ran.setdefault(r["node"], set()).add(r["pool"])
    fns = [n for n in loaded.plan.nodes if n.op == "fn"]
    summary = loaded.plan.summary()
    for node in fns:
        site = fn_site(loaded.plan, node)
        assert ran[node.name] == {site.pool}, (case, node.name, site, ran[node.name])
        line = next(x for x in summary.splitlines() if x.strip().startswith(node.name + " "))
        assert site_label(loaded.plan, node) in line
        assert ("driver" in line) == (site.how == "driver"), line
    if case == "ppo_adaptive_kl":
        assert fn_site(loaded.plan, loaded.plan.node("kl_in_reward")).how == "driver"
    if case == "grpo_reward_pool":  # put with the first call that reads it: the rollout's
        assert fn_site(loaded.plan, loaded.plan.node("grpo_advantages")).pool == "main"


# ------------------------------------------------------------------ counts
def _emitted_counts() -> dict[str, float]:
    """The count metrics the project's workers emit, from their own code paths."""
    from hybridflow.agents.episodes import Episode
    eps = [Episode(i, {}, reward=1.0, status=s, tool_calls=2) for i, s in enumerate(
           ("done", "truncated", "env_error", "env_timeout", "tool_error"))]
    metrics = RolloutResult(eps, generate_calls=3, generated_rows=10).compute_metrics()
    return {k: v for k, v in metrics.items() if is_summed(k)}


def test_the_project_emits_its_counts_under_the_rule():
    counts = _emitted_counts()
    assert {"agent/episodes_total", "agent/tool_calls_total", "agent/env_errors_total",
            "agent/env_timeouts_total", "agent/tool_errors_total", "agent/truncated_total",
            "agent/generate_calls_total"} <= set(counts)
    from hybridflow.workers import reward  # the scorer's timeouts
    assert "reward/timeouts_total" in open(reward.__file__).read()


@pytest.mark.parametrize("merge", ["ranks", "uneven_ranks", "rounds"])
def test_every_count_is_summed_and_every_mean_averaged(merge):
    counts = _emitted_counts()
    parts = [{**counts, "agent/turns/mean": 1.0}, {**counts, "agent/turns/mean": 3.0}]
    if merge == "rounds":
        out = sum_round_metrics(parts)
    else:
        out = merge_metrics(parts, [5, 5] if merge == "ranks" else [1, 3])
    for key, value in counts.items():
        assert out[key] == 2 * value, key
    assert out["agent/turns/mean"] == (2.0 if merge != "uneven_ranks" else 2.5)


PROBE = '''
from hybridflow import Batch, Graph, node_fn
from graphs.grpo import ALGORITHM, defaults


@node_fn(reads=("scores",), writes=("probe",), rows=True)
def probe(batch):
    out = Batch({"probe": batch["scores"].float()})
    out.meta["metrics"] = {"probe/rows_total": float(len(batch)),
                           "probe/rows_mean": float(len(batch))}
    return out


def build(cfg):
    g = Graph("probe")
    rollout = g.call("rollout.generate", g.source("prompts"), n=cfg.rollout.n)
    score = g.call("reward.score", rollout)
    g.fn(probe, score, monitor=True)
    g.call("actor.logprob", rollout, monitor=True)  # the rollout is folded into the actor
    return g
'''


@pytest.mark.slow  # a step with the reward on two ranks (~5 s)
def test_a_count_over_data_parallel_ranks_is_their_sum(tmp_path):
    """The probe runs sharded on the reward pool's 2 ranks (4 prompts x 2 = 8 rows)."""
    path = tmp_path / "probe.py"
    path.write_text(textwrap.dedent(PROBE))
    loaded = prepare(str(path), [f"trainer.runs_dir={tmp_path}", *SMALL,
                                 "placement.pools.rw.devices_per_node=2",
                                 "placement.roles.reward=rw"])
    site = fn_site(loaded.plan, loaded.plan.node("probe"))
    assert site == ("sharded", "rw")
    run = new_run_dir(str(tmp_path), "probe")
    trainer = Trainer(loaded, run)
    try:
        trainer.fit()
    finally:
        trainer.close()
    metrics = run.read_metrics()[-1]
    assert metrics["probe/rows_total"] == 8.0  # summed over the ranks
    assert metrics["probe/rows_mean"] == 4.0   # a mean stays a mean


# ------------------------------------------------------------------ dumps
@pytest.mark.slow  # two training steps (~6 s)
def test_dump_batches_writes_every_nodes_output_of_the_steps_named(tmp_path):
    loaded, run = _run("grpo", tmp_path, "trainer.steps=2", "trainer.dump_batches=[2]")
    folder = os.path.join(run.path, "batches")
    assert os.listdir(folder) == ["step_000002"]
    names = {os.path.splitext(f)[0] for f in os.listdir(os.path.join(folder, "step_000002"))}
    assert names == {n.name for n in loaded.plan.nodes if n.output_keys}
    batch = load_batch(os.path.join(folder, "step_000002", "rollout.generate.pt"))
    assert batch["step"] == 2 and batch["rows"] == 8
    assert batch["tensors"]["response_mask"].shape[0] == 8
    assert len(batch["columns"]["uid"]) == 8
    adv = load_batch(os.path.join(folder, "step_000002", "grpo_advantages.pt"))
    assert set(adv["tensors"]) == {"advantages"}
