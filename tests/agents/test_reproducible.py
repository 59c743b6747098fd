"""Issue 26 class 10: agent runs are reproducible. The runner's generate calls were
formed from whichever environment calls had finished (thread timing, and the order
of a set of asyncio tasks), so a sampler drawing from one RNG stream got different
groups, hence different samples, run to run. With `deterministic` (the run's
default, `agent.deterministic=true`) the groups and their order depend only on the
episodes: swept over environment latencies (threads finishing in any order), batch
limits and admission limits; and two runs of the shipped graphs/agent_grpo.py with
one seed are bit-identical, metrics and batches."""
from __future__ import annotations

import os
import random

import pytest
import torch

from hybridflow.agents import EpisodeRunner, PlainFormat, RunnerOptions
from hybridflow.agents.runner import GeneratedTurn
from hybridflow.run.batch_dump import load_batch
from tests.support.agent_fakes import ScriptedEnv, scripted_rows
from tests.support.e2e import train
from tests.support.runs import stable


class StreamSampler:
    """Draws every turn from ONE seeded stream, in call order, as a rollout engine
    sampling from the global torch RNG does: its turns depend on how calls are grouped."""

    def __init__(self, token_ids, stop_id, seed=0):
        self.token_ids, self.stop_id = list(token_ids), stop_id
        self.rng = torch.Generator().manual_seed(seed)

    def __call__(self, contexts, max_new_tokens):
        out = []
        for _ in contexts:
            n = int(torch.randint(1, 4, (1,), generator=self.rng))
            ids = [self.token_ids[int(i)] for i in
                   torch.randint(len(self.token_ids), (n,), generator=self.rng)]
            out.append(GeneratedTurn((ids + [self.stop_id])[:max_new_tokens],
                                     [-0.5] * min(n + 1, max_new_tokens)))
        return out


SCHEDULES = {  # case -> (runner options, latency range of each step in ms)
    "no_latency": ({}, (0, 0)),
    "random_latency": ({}, (0, 15)),
    "batch_limit": ({"max_batch_rows": 3}, (0, 15)),
    "admission_limit": ({"max_active": 4}, (0, 15)),
    "few_threads": ({"env_threads": 2}, (0, 10)),
}


def _play(char_tokenizer, rows, seed_sampler, **options):
    ids = char_tokenizer.convert_tokens_to_ids(list("abcdefgh"))
    sampler = StreamSampler(ids, char_tokenizer.eos_token_id, seed_sampler)
    runner = EpisodeRunner(ScriptedEnv, sampler, PlainFormat(char_tokenizer),
                           RunnerOptions(max_turns=3, step_timeout_s=5.0, **options),
                           "scripted")
    result = runner.run(rows)
    return [(e.status, e.reward, tuple(e.trajectory.context_ids()) if e.trajectory else ())
            for e in result.episodes]


@pytest.mark.parametrize("case", sorted(SCHEDULES))
def test_the_same_seed_gives_the_same_episodes_whatever_the_threads_do(char_tokenizer,
                                                                       case):
    options, latency = SCHEDULES[case]
    rows = scripted_rows(10, seed=3, max_turns=3, latency_ms=latency)
    runs = []
    for attempt in range(3):
        for row in rows:  # a different finishing order of the threads each time
            rng = random.Random(attempt)
            row["latency_s"] = [rng.uniform(*latency) / 1000 for _ in row["latency_s"]]
        runs.append(_play(char_tokenizer, rows, 0, deterministic=True, **options))
    assert runs[0] == runs[1] == runs[2]
    assert any(len(t) for _, _, t in runs[0])


@pytest.mark.slow  # two agent_grpo runs of 2 steps (~90 s)
def test_two_runs_of_agent_grpo_with_one_seed_are_bit_identical(tmp_path):
    common = ("trainer.steps=2", "trainer.val_every=0", "trainer.seed=7",
              "data.batch_size=4", "rollout.n=2", "actor.mini_batch_size=8",
              "trainer.dump_batches=[1,2]")
    runs = [train("agent_grpo", tmp_path / name, *common) for name in ("a", "b")]
    metrics = [stable(m) for _, m in runs]
    assert metrics[0] == metrics[1]
    dirs = [trainer.run.path for trainer, _ in runs]
    for step in ("step_000001", "step_000002"):
        names = sorted(os.listdir(os.path.join(dirs[0], "batches", step)))
        assert names == sorted(os.listdir(os.path.join(dirs[1], "batches", step)))
        for name in names:
            a, b = (load_batch(os.path.join(d, "batches", step, name)) for d in dirs)
            for key in a["tensors"]:
                assert torch.equal(a["tensors"][key], b["tensors"][key]), (step, name, key)
            assert a["columns"] == b["columns"], (step, name)
