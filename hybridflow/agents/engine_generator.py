"""`EngineGenerator`: a rollout engine as the runner's generator (token ids in,
token ids and log-probs out).

An engine here is anything with `generate(prompts: Batch, opts: RolloutConfig) ->
Batch` taking left-padded `input_ids`/`attention_mask` and returning right-padded
`responses` with a `response_mask` that ends at the first EOS, plus
`rollout_log_probs` where the engine reports them: the engines of
`hybridflow/workers/rollout/` (`hf`, `vllm`, or one registered by name; see
`make_engine`). The chat format's stop token must be the tokenizer's EOS, which is
where those engines stop.

Stateless apart from the engine and the sampling options it was given.
"""
from __future__ import annotations

from dataclasses import replace

import torch

from hybridflow.core.batch import Batch
from hybridflow.agents.runner import GeneratedTurn

__all__ = ["EngineGenerator", "left_pad"]


def left_pad(contexts: list[list[int]], pad_id: int) -> Batch:
    """`input_ids` and `attention_mask` [B, longest context], padded on the left."""
    width = max(len(c) for c in contexts)
    ids = torch.full((len(contexts), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, context in enumerate(contexts):
        if context:
            ids[i, width - len(context):] = torch.tensor(context, dtype=torch.long)
            mask[i, width - len(context):] = 1
    return Batch({"input_ids": ids, "attention_mask": mask})


class EngineGenerator:
    def __init__(self, engine, opts, pad_id: int):
        self.engine, self.opts, self.pad_id = engine, replace(opts, n=1), pad_id
        self.reports_log_probs = False  # set at the first call that gets them

    def __call__(self, contexts: list[list[int]], max_new_tokens: int) -> list[GeneratedTurn]:
        if not contexts:
            return []
        out = self.engine.generate(left_pad(contexts, self.pad_id),
                                   replace(self.opts, max_new_tokens=max_new_tokens))
        responses, mask = out["responses"].cpu(), out["response_mask"].cpu().bool()
        log_probs = out.get("rollout_log_probs")
        self.reports_log_probs = log_probs is not None
        turns = []
        for i in range(len(contexts)):
            ids = responses[i][mask[i]].tolist()
            lps = log_probs[i].cpu()[mask[i]].tolist() if log_probs is not None else None
            turns.append(GeneratedTurn(ids, lps))
        return turns
