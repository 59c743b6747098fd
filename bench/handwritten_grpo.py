"""GRPO written by hand in one process: the baseline bench/step.py compares the engine to.

The same math and settings as `graphs/grpo.py` with its embedded default, with no
engine in between: the same base model (graphs/assets/toy_base) as policy, no KL term
(so no reference model, as `actor.use_kl_loss=false` drops it from the graph), the toy
task's prompts (16 a step, shuffled the same way), 8 samples each by Hugging Face
`generate` (one call of 128, 4 new tokens, temperature 1), old log-probs
(micro-batches of 64), rewards by
`algorithms.rewards.compute_score`, group advantages by `algorithms.advantages.grpo`,
and one PPO epoch of `algorithms.losses.ppo_policy_loss` over mini-batches of 64 rows
(AdamW lr 2e-4, betas 0.9/0.999, weight decay 0.01, grad clip 1.0, token-mean).
The entropy metric the engine logs is computed too, so both do the same work.
"""
from __future__ import annotations

import random

import numpy as np
import torch

from hybridflow.algorithms.advantages import grpo
from hybridflow.algorithms.losses import entropy_from_logits, ppo_policy_loss
from hybridflow.algorithms.masked import masked_mean
from hybridflow.algorithms.rewards import compute_score
from bench import workload
from hybridflow.graphs.common import TOY_BASE

__all__ = ["HandwrittenGRPO", "Settings"]


class Settings:
    prompts = 16
    n = 8
    max_new_tokens = 4
    temperature = 1.0
    gen_micro_batch = 128
    logprob_micro_batch = 64
    mini_batch = 64
    micro_batch = 64
    lr, betas, weight_decay, grad_clip = 2e-4, (0.9, 0.999), 0.01, 1.0
    clip_low = clip_high = 0.2
    clip_c = 3.0
    max_prompt_length = 8
    seed = 1


class HandwrittenGRPO:
    def __init__(self, settings: Settings | None = None, model_path: str = TOY_BASE):
        from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

        from hybridflow.core.data import toy_rows  # the same toy problems, nothing else
        s = self.s = settings or Settings()
        self.tok = AutoTokenizer.from_pretrained(model_path)
        self.pad, self.eos = self.tok.pad_token_id, self.tok.eos_token_id
        self.policy = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        self.opt = torch.optim.AdamW(self.policy.parameters(), lr=s.lr, betas=s.betas,
                                     weight_decay=s.weight_decay)
        self.sample_cfg = GenerationConfig(
            max_new_tokens=s.max_new_tokens, min_new_tokens=0, do_sample=True,
            temperature=s.temperature, top_p=1.0, top_k=0, pad_token_id=self.pad,
            eos_token_id=self.eos, use_cache=True)
        self.greedy_cfg = GenerationConfig(
            max_new_tokens=s.max_new_tokens, min_new_tokens=0, do_sample=False,
            pad_token_id=self.pad, eos_token_id=self.eos, use_cache=True)
        train, test = toy_rows(s.seed, 9, 0.25)
        self.train = [r for r in train if len(self._ids(r)) <= s.max_prompt_length]
        self.test = test
        self.epoch, self.cursor = 0, 0
        self.order = self._shuffled()

    # ---------------------------------------------------------------- data
    def _ids(self, row) -> list[int]:
        return self.tok(row["prompt"], add_special_tokens=False)["input_ids"]

    def _shuffled(self) -> list[int]:
        order = list(range(len(self.train)))
        random.Random(self.s.seed * 100003 + self.epoch).shuffle(order)
        return order

    def next_rows(self) -> list[dict]:
        rows = []
        while len(rows) < self.s.prompts:
            if self.cursor >= len(self.order):
                self.epoch, self.cursor = self.epoch + 1, 0
                self.order = self._shuffled()
            rows.append(self.train[self.order[self.cursor]])
            self.cursor += 1
        return rows

    def left_pad(self, rows) -> tuple[torch.Tensor, torch.Tensor]:
        return workload.left_pad([self._ids(r) for r in rows], self.pad)

    # ------------------------------------------------------------- rollout
    @torch.no_grad()
    def generate(self, ids, mask, config, micro: int):
        self.policy.eval()
        out = []
        for i in range(0, len(ids), micro):
            m = mask[i:i + micro]
            seqs = self.policy.generate(input_ids=ids[i:i + micro], attention_mask=m,
                                        position_ids=(m.cumsum(-1) - 1).clamp(min=0),
                                        generation_config=config)
            resp = seqs[:, ids.shape[1]:]
            fill = resp.new_full((len(resp), self.s.max_new_tokens - resp.shape[1]), self.pad)
            out.append(torch.cat([resp, fill], 1))
        self.policy.train()
        resp = torch.cat(out)
        is_eos = (resp == self.eos).long()
        resp_mask = ((is_eos.cumsum(-1) - is_eos) == 0).long()
        return torch.where(resp_mask.bool(), resp, torch.full_like(resp, self.pad)), resp_mask

    def scores(self, rows, resp, resp_mask) -> torch.Tensor:
        texts = [self.tok.decode(r[m.bool()].tolist(), skip_special_tokens=True)
                 for r, m in zip(resp, resp_mask)]
        return torch.tensor([float(compute_score(row["data_source"], text,
                                                 row["reward_model"]["ground_truth"]))
                             for row, text in zip(rows, texts)])

    # ------------------------------------------------------------ log-probs
    def logprobs(self, model, ids, attn, pos, resp, with_entropy=False):
        width = resp.shape[1]
        logits = model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False,
                       logits_to_keep=width + 1).logits[:, :-1].float()
        logits = logits / self.s.temperature if self.s.temperature != 1.0 else logits
        logp = torch.gather(logits, -1, resp.unsqueeze(-1)).squeeze(-1) \
            - torch.logsumexp(logits, -1)
        ent = entropy_from_logits(logits.detach()) if with_entropy else None
        return logp, ent

    @torch.no_grad()
    def batched_logprobs(self, model, ids, attn, pos, resp) -> torch.Tensor:
        mb = self.s.logprob_micro_batch
        return torch.cat([self.logprobs(model, ids[i:i + mb], attn[i:i + mb], pos[i:i + mb],
                                        resp[i:i + mb])[0] for i in range(0, len(ids), mb)])

    # ----------------------------------------------------------------- step
    def step(self) -> dict:
        s = self.s
        rows = self.next_rows()
        prompt_ids, prompt_mask = self.left_pad(rows)
        ids, pmask = prompt_ids.repeat_interleave(s.n, 0), prompt_mask.repeat_interleave(s.n, 0)
        rows = [r for r in rows for _ in range(s.n)]
        uid = np.repeat(np.arange(s.prompts), s.n)
        resp, resp_mask = self.generate(ids, pmask, self.sample_cfg, s.gen_micro_batch)
        full = torch.cat([ids, resp], 1)
        attn = torch.cat([pmask, resp_mask], 1)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        old = self.batched_logprobs(self.policy, full, attn, pos, resp)
        scores = self.scores(rows, resp, resp_mask)
        adv, _ = grpo(scores, uid, resp_mask, 1e-6, True)
        losses = []
        for a in range(0, len(full), s.mini_batch):
            sl = slice(a, a + s.mini_batch)
            tokens = resp_mask[sl].sum().double()
            seqs = (resp_mask[sl].sum(-1) > 0).sum().double()
            self.opt.zero_grad(set_to_none=True)
            for b in range(a, min(a + s.mini_batch, len(full)), s.micro_batch):
                mb = slice(b, min(b + s.micro_batch, a + s.mini_batch))
                logp, ent = self.logprobs(self.policy, full[mb], attn[mb], pos[mb], resp[mb],
                                          with_entropy=True)
                loss, _ = ppo_policy_loss(logp, old[mb], adv[mb], resp_mask[mb], s.clip_low,
                                          s.clip_high, s.clip_c, "token-mean",
                                          global_tokens=tokens, global_seqs=seqs,
                                          norm_constant=float(resp_mask.shape[1]))
                masked_mean(ent, resp_mask[mb])  # the entropy metric
                loss.backward()
                losses.append(float(loss.detach()))
            torch.nn.utils.clip_grad_norm_(self.policy.parameters(), s.grad_clip)
            self.opt.step()
        return {"score": float(scores.mean()), "pg_loss": float(np.mean(losses))}

    @torch.no_grad()
    def greedy_accuracy(self) -> float:
        ids, mask = self.left_pad(self.test)
        resp, resp_mask = self.generate(ids, mask, self.greedy_cfg, 256)
        return float(self.scores(self.test, resp, resp_mask).mean())
