"""What `bench/scale.py` shares between its variants, and its hand-written GRPO loop.

- `sample_responses`: the one generate every variant uses: Hugging Face `generate`
  (sampling, KV cache, one call for all rows) with a logits processor that ends each
  row at a length drawn from `bench.workload.response_lengths` (seeded per step), so
  a model with random weights writes responses of realistic, long-tailed lengths.
  The engine runs it as its rollout engine (`rollout.backend=bench.scale_loop:
  length_sampled_engine`), the hand-written loop calls it directly: the same rows,
  the same lengths, the same work in every variant's k-th step.
- `compute_score`: a rule scorer for the random text (a hash: deterministic, cheap).
- `write_prompts`: a JSONL dataset (verl's schema) of random-text prompts whose
  lengths are uniform in [24, 64] characters (char tokenizer: one token each).
- `HandwrittenScale`: GRPO by hand in one process on the same model, prompts,
  generate and settings as the engine's padded row-count variant (no KL, one PPO
  epoch, one mini-batch of every row, row micro-batches, AdamW, token-mean PPO loss
  with the entropy metric), timing each phase.
"""
from __future__ import annotations

import json
import random
import time
import zlib

import torch

from bench import workload

__all__ = ["LengthStop", "sample_responses", "length_sampled_engine", "compute_score",
           "write_prompts", "HandwrittenScale"]

DATA_SOURCE = "scale"


class LengthStop:
    """Logits processor: EOS exactly when a row reaches its drawn length."""

    def __init__(self, rows: int, max_response: int, prompt_width: int, eos_id: int,
                 seed: int):
        self.lengths = workload.response_lengths(rows, max_response, seed=seed)
        self.prompt_width, self.eos_id = prompt_width, eos_id

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        step = input_ids.shape[1] - self.prompt_width
        done = (self.lengths[: scores.shape[0]].to(scores.device) - 1) <= step
        scores = scores.clone()
        scores[:, self.eos_id] = float("-inf")
        scores[done] = float("-inf")
        scores[done, self.eos_id] = 0.0
        return scores


@torch.no_grad()
def sample_responses(module, ids: torch.Tensor, mask: torch.Tensor, max_new_tokens: int,
                     pad_id: int, eos_id: int, seed: int) -> torch.Tensor:
    """[rows, max_new_tokens] sampled response ids, right-padded with `pad_id`."""
    from transformers import GenerationConfig, LogitsProcessorList
    was_training = module.training
    module.eval()
    config = GenerationConfig(max_new_tokens=max_new_tokens, min_new_tokens=0,
                              do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                              pad_token_id=pad_id, eos_token_id=eos_id, use_cache=True)
    stop = LengthStop(len(ids), max_new_tokens, ids.shape[1], eos_id, seed)
    try:
        out = module.generate(input_ids=ids, attention_mask=mask,
                              position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                              generation_config=config,
                              logits_processor=LogitsProcessorList([stop]))
    finally:
        module.train(was_training)
    new = out[:, ids.shape[1]:]
    return torch.nn.functional.pad(new, (0, max_new_tokens - new.shape[1]), value=pad_id)


class LengthSampledEngine:
    """A rollout engine over the actor's own module that generates with
    `sample_responses`; its k-th call draws the lengths of seed k."""

    shares_module = True

    def __init__(self, spec):
        self.module, self.tokenizer = spec.module, spec.tokenizer
        self.policy_version, self.calls = 0, 0

    def generate(self, prompts, opts):
        from hybridflow.workers.rollout.generation import assemble_rollout
        pad, eos = self.tokenizer.pad_token_id, self.tokenizer.eos_token_id
        responses = sample_responses(self.module, prompts["input_ids"],
                                     prompts["attention_mask"], opts.max_new_tokens, pad,
                                     eos, seed=self.calls)
        self.calls += 1
        return assemble_rollout(prompts, responses, pad, eos)

    def load_weights(self, weights) -> None:
        raise NotImplementedError("the bench engine shares the actor's module")

    def finish_weight_update(self, version: int) -> None:
        self.policy_version = version

    def sleep(self) -> None:
        pass

    def wake_up(self) -> None:
        pass


def length_sampled_engine(spec) -> LengthSampledEngine:
    return LengthSampledEngine(spec)


def compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float:
    return (zlib.crc32(solution_str.encode()) % 1000) / 1000.0


def write_prompts(path: str, count: int, min_len: int = 24, max_len: int = 64,
                  seed: int = 0) -> list[str]:
    """`count` random-text prompts as JSONL at `path`; returns their texts."""
    rng = random.Random(seed)
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789+-*= "
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(min_len, max_len)))
             .strip() or "a" for _ in range(count)]
    with open(path, "w") as handle:
        for text in texts:
            handle.write(json.dumps({"data_source": DATA_SOURCE, "prompt": text,
                                     "reward_model": {"ground_truth": "0"}}) + "\n")
    return texts


class HandwrittenScale:
    """GRPO in one process, padded rows; `step()` returns phase seconds and tokens."""

    def __init__(self, texts: list[str], size: str, prompts: int, n: int,
                 max_response: int, micro_batch: int, lr: float = 1e-6, seed: int = 0):
        from hybridflow.workers.tokenizer import load_tokenizer
        self.tok = load_tokenizer("char")
        self.pad, self.eos = self.tok.pad_token_id, self.tok.eos_token_id
        self.policy = workload.make_model(size, seed=seed)
        self.opt = torch.optim.AdamW(self.policy.parameters(), lr=lr, betas=(0.9, 0.999),
                                     weight_decay=0.01)
        self.texts, self.prompts, self.n = texts, prompts, n
        self.max_response, self.micro = max_response, micro_batch
        self.calls, self.cursor = 0, 0

    def _prompt_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        texts = [self.texts[(self.cursor + i) % len(self.texts)] for i in range(self.prompts)]
        self.cursor += self.prompts
        ids = [self.tok(t, add_special_tokens=False)["input_ids"] for t in texts]
        input_ids, mask = workload.left_pad(ids, self.pad)
        return input_ids.repeat_interleave(self.n, 0), mask.repeat_interleave(self.n, 0)

    def _logprobs(self, ids, attn, pos, resp, with_entropy=False):
        from hybridflow.algorithms.losses import entropy_from_logits
        logits = self.policy(input_ids=ids, attention_mask=attn, position_ids=pos,
                             use_cache=False,
                             logits_to_keep=resp.shape[1] + 1).logits[:, :-1].float()
        logp = torch.gather(logits, -1, resp.unsqueeze(-1)).squeeze(-1) \
            - torch.logsumexp(logits, -1)
        return logp, (entropy_from_logits(logits.detach()) if with_entropy else None)

    def step(self) -> dict:
        from hybridflow.algorithms.advantages import grpo
        from hybridflow.algorithms.losses import ppo_policy_loss
        from hybridflow.algorithms.masked import masked_mean
        clock = {}
        mark = time.perf_counter()
        ids, pmask = self._prompt_batch()
        resp = sample_responses(self.policy, ids, pmask, self.max_response, self.pad,
                                self.eos, seed=self.calls)
        self.calls += 1
        is_eos = (resp == self.eos).long()
        resp_mask = ((is_eos.cumsum(-1) - is_eos) == 0).long()
        resp = torch.where(resp_mask.bool(), resp, self.pad)
        full, attn = torch.cat([ids, resp], 1), torch.cat([pmask, resp_mask], 1)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        clock["rollout.generate"], mark = time.perf_counter() - mark, time.perf_counter()
        mb = self.micro
        with torch.no_grad():
            old = torch.cat([self._logprobs(full[i:i + mb], attn[i:i + mb], pos[i:i + mb],
                                            resp[i:i + mb])[0]
                             for i in range(0, len(full), mb)])
        clock["actor.logprob"], mark = time.perf_counter() - mark, time.perf_counter()
        texts = [self.tok.decode(r[m.bool()].tolist(), skip_special_tokens=True)
                 for r, m in zip(resp, resp_mask)]
        scores = torch.tensor([compute_score(DATA_SOURCE, t, "0") for t in texts])
        uid = torch.arange(len(full)) // self.n
        adv, _ = grpo(scores, uid.numpy(), resp_mask, 1e-6, True)
        clock["reward.score+advantages"], mark = time.perf_counter() - mark, time.perf_counter()
        tokens = resp_mask.sum().double()
        seqs = (resp_mask.sum(-1) > 0).sum().double()
        self.opt.zero_grad(set_to_none=True)
        for b in range(0, len(full), mb):
            sl = slice(b, b + mb)
            logp, ent = self._logprobs(full[sl], attn[sl], pos[sl], resp[sl], True)
            loss, _ = ppo_policy_loss(logp, old[sl], adv[sl], resp_mask[sl], 0.2, 0.2, 3.0,
                                      "token-mean", global_tokens=tokens, global_seqs=seqs,
                                      norm_constant=float(resp.shape[1]))
            masked_mean(ent, resp_mask[sl])  # the entropy metric the engine logs
            loss.backward()
        torch.nn.utils.clip_grad_norm_(self.policy.parameters(), 1.0)
        self.opt.step()
        clock["actor.update"] = time.perf_counter() - mark
        return {"phases_s": clock, "generated_tokens": int(resp_mask.sum()),
                "trained_tokens": int(attn.sum()), "computed_cells": int(attn.numel())}
