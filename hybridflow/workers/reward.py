"""RewardWorker: rule-based scores (by data_source) or a reward model.

Reads the `model` (tokenizer for decoding) and `reward` sections. With
`reward.model_path` set, a sequence-classification reward model scores each
prompt+response at its last token; otherwise each response is decoded and scored by
the rule scorer (the built-in `compute_score` dispatching on data_source, or the
user's `function_path`/`function_name`). Either way the score is written at the
last valid response token of `token_level_scores` [B, R] and as `scores` [B].
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from hybridflow.batch import Batch
from hybridflow.dispatch import DP, method
from hybridflow.workers.base import Worker, metrics_batch
from hybridflow.workers.config import ModelConfig, RewardConfig, read_section
from hybridflow.workers.models import build_reward_model
from hybridflow.workers.reward_pool import RuleScorer, ScorerRef
from hybridflow.workers.tokenizer import load_tokenizer, tokenizer_spec

__all__ = ["RewardWorker", "place_scores"]


def place_scores(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """[B] scores -> [B, R] zeros with each score at the row's last valid token
    (index 0 for an empty response, which every masked reduction then ignores)."""
    out = torch.zeros(response_mask.shape, dtype=torch.float32)
    last = (response_mask.long().sum(-1) - 1).clamp(min=0)
    if len(out):
        out[torch.arange(len(out)), last] = scores.float()
    return out


class RewardWorker(Worker):
    @staticmethod
    def data_row_check(cfg) -> Callable[[str, object], None] | None:
        """What the data loader checks in each row for this worker's scorer
        (`check(data_source, ground_truth)` raising ValueError): the built-in scorer
        needs a known data_source and a string answer, a user's scorer any non-null
        answer; a reward model reads neither."""
        rc = read_section(cfg, "reward", RewardConfig)
        if rc.model_path:
            return None
        return ScorerRef(rc.function_path, rc.function_name).sample_check()

    def __init__(self, cfg, ctx=None):
        super().__init__(cfg, ctx)
        self.model_cfg = read_section(cfg, "model", ModelConfig)
        self.reward_cfg = read_section(cfg, "reward", RewardConfig)
        self.tokenizer = load_tokenizer(tokenizer_spec(self.model_cfg))
        rc = self.reward_cfg
        if rc.model_path:
            import os
            self.device = self._device(self.model_cfg.device)
            has_tok = any(os.path.exists(os.path.join(rc.model_path, f))
                          for f in ("tokenizer.json", "tokenizer_config.json"))
            self.rm_tokenizer = load_tokenizer(rc.model_path) if has_tok else self.tokenizer
            self.module = build_reward_model(self.model_cfg, self.rm_tokenizer, self.device,
                                             rc.model_path, self.ctx.seed)
            self.module.eval().requires_grad_(False)
            self.rule = None
        else:
            self.rule = RuleScorer(ScorerRef(rc.function_path, rc.function_name),
                                   rc.num_workers, rc.timeout_s)

    @method(dispatch=DP, reads=("responses", "response_mask", "data_source", "ground_truth"),
            writes=("token_level_scores", "scores"), kind="inference",
            optional=("extra_info", "prompts"))
    def score(self, batch: Batch) -> Batch:
        """One score per response, at its last valid token."""
        mask = batch["response_mask"].cpu()
        if len(batch) == 0:
            scores, metrics = torch.zeros(0), {}
        elif self.rule is not None:
            scores, metrics = self._rule_scores(batch)
        else:
            scores, metrics = self._model_scores(batch)
        out = Batch({"token_level_scores": place_scores(scores, mask),
                     "scores": scores.float()})
        return metrics_batch(out, metrics)

    def _decode_responses(self, batch: Batch) -> list[str]:
        responses, mask = batch["responses"].cpu(), batch["response_mask"].cpu()
        return [self.tokenizer.decode(ids[m.bool()].tolist(), skip_special_tokens=True)
                for ids, m in zip(responses, mask)]

    def _rule_scores(self, batch: Batch):
        texts = self._decode_responses(batch)
        extra = batch.get("extra_info", np.full(len(batch), None, dtype=object))
        samples = [{"data_source": ds, "solution_str": text, "ground_truth": gt,
                    "extra_info": info}
                   for ds, text, gt, info in zip(batch["data_source"], texts,
                                                 batch["ground_truth"], extra)]
        results = self.rule.score(samples)
        scores = torch.tensor([r.score for r in results], dtype=torch.float32)
        metrics = {"critic/score/mean": float(scores.mean()),
                   "reward/timeouts": float(sum(r.timed_out for r in results))}
        sums: dict[str, list] = {}
        for r in results:
            for key, value in (r.extra or {}).items():
                if isinstance(value, (int, float, bool)) and not isinstance(value, str):
                    sums.setdefault(key, []).append(float(value))
        metrics.update({f"reward/{k}": sum(v) / len(v) for k, v in sums.items()})
        return scores, metrics

    @torch.no_grad()
    def _model_scores(self, batch: Batch):
        if "prompts" not in batch:
            raise KeyError("the reward model scores prompt + response: its input needs "
                           "'prompts' (the output of actor.generate has it)")
        prompts = [self.tokenizer.decode(p.tolist(), skip_special_tokens=True)
                   for p in batch["prompts"].cpu()]
        texts = [p + r for p, r in zip(prompts, self._decode_responses(batch))]
        tok, mbs, scores = self.rm_tokenizer, self.reward_cfg.micro_batch_size, []
        for i in range(0, len(texts), mbs):
            enc = tok(texts[i:i + mbs], padding=True, return_tensors="pt",
                      padding_side="right").to(self.device)
            logits = self.module(input_ids=enc["input_ids"],
                                 attention_mask=enc["attention_mask"]).logits
            scores.append(logits[:, 0].float().cpu())
        scores = torch.cat(scores)
        return scores, {"critic/score/mean": float(scores.mean())}
