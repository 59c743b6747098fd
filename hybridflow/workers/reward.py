"""RewardWorker: rule-based scores (by data_source) or a reward model.

Reads the `model` (tokenizer for decoding) and `reward` sections. With
`reward.model_path` set, a sequence-classification reward model scores each
prompt+response at its last token; otherwise each response is decoded and scored by
the rule scorer (the scorer `reward.scorer_table` registers for the row's
data_source, or the user's `function_path`/`function_name`). Either way the score is written at the
last valid response token of `token_level_scores` [B, R] and as `scores` [B].
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from hybridflow.core.batch import Batch
from hybridflow.core.metric_names import SCORE_MEAN
from hybridflow.graph.dispatch import DP, method
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


_SINGLE = ""  # the name of the one scorer of reward.function_path (not logged apart)


def scorer_components(rc: RewardConfig) -> dict[str, tuple[float, ScorerRef]]:
    """name -> (weight, scorer): `reward.scorers`, or the single scorer of
    `reward.function_path`/`function_name`/`kwargs` with weight 1."""
    if not rc.scorers:
        return {_SINGLE: (1.0, ScorerRef(rc.function_path, rc.function_name,
                                         tuple(sorted(dict(rc.kwargs).items())),
                                         rc.scorer_table))}
    components = {}
    for name, spec in rc.scorers.items():
        spec = dict(spec or {})
        unknown = sorted(set(spec) - {"function_path", "function_name", "weight", "kwargs"})
        if unknown:
            raise ValueError(f"reward.scorers.{name} has unknown key(s) {unknown}; known: "
                             f"function_path, function_name, weight, kwargs")
        ref = ScorerRef(spec.get("function_path"), spec.get("function_name", "compute_score"),
                        tuple(sorted(dict(spec.get("kwargs") or {}).items())),
                        rc.scorer_table)
        components[str(name)] = (float(spec.get("weight", 1.0)), ref)
    return components


class RewardWorker(Worker):
    @staticmethod
    def model_source(cfg) -> str:
        """What scores (for `hybridflow check`): the reward model, or the scorers."""
        rc = read_section(cfg, "reward", RewardConfig)
        if rc.model_path:
            return f"{rc.model_path} (reward.model_path)"
        parts = scorer_components(rc)
        if set(parts) == {_SINGLE}:
            ref = parts[_SINGLE][1]
            where = " (reward.function_path)" if ref.path else ""
            return f"rule scorer {ref.describe()}{where}"
        return "rule scorers " + ", ".join(f"{name}={weight:g} x {ref.describe()}"
                                           for name, (weight, ref) in parts.items())

    @staticmethod
    def data_row_check(cfg) -> Callable[[str, object], None] | None:
        """What the data loader checks in each row for this worker's scorer
        (`check(data_source, ground_truth)` raising ValueError): the built-in scorer
        needs a known data_source and a string answer, a user's scorer any non-null
        answer; a reward model reads neither."""
        rc = read_section(cfg, "reward", RewardConfig)
        if rc.model_path:
            return None
        checks = [ref.sample_check() for _, ref in scorer_components(rc).values()]

        def check_all(data_source: str, ground_truth: object) -> None:
            for check in checks:
                check(data_source, ground_truth)
        return check_all

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
            self.rule, self.rules = None, {}
        else:
            self.rules = {name: (weight, RuleScorer(ref, rc.num_workers, rc.timeout_s,
                                                     rc.max_consecutive_timeouts))
                          for name, (weight, ref) in scorer_components(rc).items()}
            self.rule = next(iter(self.rules.values()))[1]  # the first (often only) one

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

    def _samples(self, batch: Batch) -> list[dict]:
        """What a scorer is called with: the contract arguments and the response facts
        (token count with EOS, and whether it ended with EOS)."""
        texts = self._decode_responses(batch)
        extra = batch.get("extra_info", np.full(len(batch), None, dtype=object))
        responses, mask = batch["responses"].cpu(), batch["response_mask"].cpu()
        lengths = mask.long().sum(-1)
        last = responses[torch.arange(len(batch)), (lengths - 1).clamp(min=0)]
        stopped = (last == self.tokenizer.eos_token_id) & (lengths > 0)
        return [{"data_source": ds, "solution_str": text, "ground_truth": gt,
                 "extra_info": info, "response_length": int(n), "stopped": bool(s)}
                for ds, text, gt, info, n, s in zip(batch["data_source"], texts,
                                                    batch["ground_truth"], extra,
                                                    lengths.tolist(), stopped.tolist())]

    def _rule_scores(self, batch: Batch):
        """The weighted sum of the scorers; each named one is logged as
        reward/<name>/mean, and its dict extras as reward/<key>."""
        samples = self._samples(batch)
        scores = torch.zeros(len(samples))
        metrics, sums, timeouts = {}, {}, 0
        for name, (weight, rule) in self.rules.items():
            results = rule.score(samples)
            part = torch.tensor([r.score for r in results], dtype=torch.float32)
            scores += weight * part
            if name != _SINGLE:
                metrics[f"reward/{name}/mean"] = float(part.mean())
            timeouts += sum(r.timed_out for r in results)
            for r in results:
                for key, value in (r.extra or {}).items():
                    if isinstance(value, (int, float, bool)) and not isinstance(value, str):
                        sums.setdefault(key, []).append(float(value))
        metrics.update({SCORE_MEAN: float(scores.mean()),
                        "reward/timeouts_total": float(timeouts)})
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
        return scores, {SCORE_MEAN: float(scores.mean())}
