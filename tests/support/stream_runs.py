"""Streaming runs from tests: train a graph and record, per step, the rows the update
read (uid, policy_version, token_versions, response_mask) and the step's metrics."""
from __future__ import annotations

from hybridflow.plan.streaming_split import TOKEN_VERSIONS, stream_buffer
from hybridflow.program.assemble import prepare
from hybridflow.run.loop import Trainer
from hybridflow.run.tracking import RunDir, new_run_dir
from tests.support.async_runs import fit_recording
from tests.support.e2e import graph_file

STREAM = ("trainer.async_mode=streaming", "trainer.val_every=0", "data.batch_size=4",
          "rollout.n=4", "actor.mini_batch_size=16", "actor.micro_batch_size=16",
          # few slots, one decode step per look at the buffer: updates land mid-response
          "rollout.micro_batch_size=8", "rollout.stream_poll_steps=1")
KEYS = ("uid", "policy_version", TOKEN_VERSIONS, "response_mask")


def stream_recording(tmp_path, *overrides, graph="grpo", resume=None, stop_after=None,
                     keys=KEYS):
    """(trainer, {step: (rows of `keys`, metrics, prompts drawn and not consumed after
    the step)}); the trainer keeps its scheduler, and in `trainer.filtered` the uids
    the entrance filter dropped in each step (a graph with a gather)."""
    loaded = prepare(graph_file(graph), [f"trainer.runs_dir={tmp_path}",
                                         "trainer.progress=false", *STREAM, *overrides])
    run = RunDir(resume) if resume else new_run_dir(str(tmp_path), loaded.graph.name)
    trainer = Trainer(loaded, run, resume_from=resume)
    name, seen, trainer.filtered = stream_buffer(loaded.plan).name, {}, {}

    def record(step, metrics):
        seen[step] = (trainer.runtime.fetch(trainer.last_result, name, keys), metrics,
                      set(trainer.scheduler.prompts))
        trainer.filtered[step] = list(trainer.scheduler.last_filtered)
    fit_recording(trainer, record, stop_after)
    return trainer, seen


def trained_uids(seen: dict) -> list[str]:
    """Each step's groups, once per group, in step order."""
    return [u for step in sorted(seen) for u in dict.fromkeys(seen[step][0]["uid"])]


def check_rows(seen: dict, k: int, n: int = 4) -> None:
    """Per sample and per token: what the admission rule and the engine promise."""
    for step, (rows, _, _) in seen.items():
        trained = step - 1  # updates before this step's
        pv, tv = rows["policy_version"], rows["token_versions"]
        mask = rows["response_mask"].bool()
        assert ((pv >= trained - k) & (pv <= trained)).all(), (step, pv.tolist())
        for version, tokens, real in zip(pv.tolist(), tv, mask):
            sampled = tokens[real]
            assert sampled.min() == version  # a row's version: its oldest token's
            assert (sampled[1:] >= sampled[:-1]).all()  # new weights, never older ones
            assert (tokens[~real] == -1).all()
        counts = {u: list(rows["uid"]).count(u) for u in rows["uid"]}
        assert set(counts.values()) == {n}  # whole groups only
