"""Continuous batching for streaming rollout (`trainer.async_mode=streaming`).

A `StreamLoop` holds requests (one sampled response each), a fixed number of decode
*slots* (`rollout.micro_batch_size`) and the module it samples with. One `step()`
refills the free slots from the queue in submission order (as the agent runner
refills episode slots), runs one decode step over the active slots, and moves the
sequences that ended (EOS or `max_new_tokens`) to the finished list. Nothing waits
for a batch to end: a slot freed by a short response takes the next request at the
next step.

Weights may change between two steps (a weight update that lands while requests are
in flight: the engine's `policy_version` changes). Each token records the version of
the weights that sampled it and its behaviour log-prob (the processed distribution it
was sampled from). On a version change:
- `partial=True` (partial rollout): the active sequences continue with the new
  weights; a response may then hold tokens of several versions;
- `partial=False`: the active sequences are aborted and re-queued at the front (their
  tokens dropped), so every response is sampled by one version.

Each sequence keeps its own KV cache (`stream_cache.py`): a decode step runs the
model on one new token per sequence, so its work is flat in the prefix length. A
cache is computed by one weights version: a new request, or one whose cache an older
version computed (a partial rollout continuing after a weight update), is prefilled
with the current weights first, so every token is sampled from exactly the weights it
is stamped with.

Sampling draws from the loop's own generator (seeded by the worker), so on the local
runtime, where the steps interleave with training in a fixed order, the same seed
gives the same tokens and versions.

State: `queue` (waiting requests), `active` (those in slots), `finished`, `version`
(the last version a step sampled with), counters. Only its methods change it.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch

from hybridflow.core.batch import Batch
from hybridflow.core.columns import NO_TOKEN, POLICY_VERSION, TOKEN_VERSIONS
from hybridflow.workers.rollout.generation import assemble_rollout
from hybridflow.workers.rollout.stream_cache import LayerKV, decode, prefill

__all__ = ["StreamLoop", "Request", "NO_TOKEN", "requests_from_rows", "assemble_requests"]



@dataclass
class Request:
    """One response to sample: its prompt (unpadded ids), the prompt's other columns
    (one row), the width its prompt row had (padding included), and what was sampled
    so far."""
    rid: int
    prompt: list[int]
    row: Batch
    width: int = 0
    tokens: list[int] = field(default_factory=list)
    logps: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    restarts: int = 0
    kv: LayerKV | None = field(default=None, repr=False)  # prompt + tokens[:-1], or all
    kv_version: int | None = None  # the weights version that computed `kv`


def requests_from_rows(rows: Batch, first_rid: int) -> list[Request]:
    """One request per row (rows already repeated n times): the prompt without its
    padding, the row's other columns; ids from `first_rid` on."""
    ids, mask = rows["input_ids"], rows["attention_mask"].bool()
    others = rows.select(*[k for k in rows.keys()
                           if k not in ("input_ids", "attention_mask", "position_ids")])
    return [Request(first_rid + i, ids[i][mask[i]].tolist(), others.take(i), ids.shape[1])
            for i in range(len(rows))]


class StreamLoop:
    def __init__(self, module, tokenizer, device, opts, seed: int, warpers=()):
        self.module, self.device, self.opts = module, device, opts
        self.warpers = list(warpers)  # the engine's sampling warpers for `opts`
        self.pad = tokenizer.pad_token_id
        eos = tokenizer.eos_token_id
        self.eos_id = eos
        self.eos = set(eos if isinstance(eos, (list, tuple)) else [eos])
        self.slots = opts.micro_batch_size
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(int(seed))
        self.queue: deque[Request] = deque()
        self.active: list[Request] = []
        self.finished: list[Request] = []
        self.version: int | None = None
        self.next_rid = 0
        self.counts = {"aborted_tokens": 0, "restarts": 0, "mixed_rows": 0, "decode_steps": 0}

    # --------------------------------------------------------------- requests
    def submit(self, rows: Batch) -> int:
        """Queue one request per row (rows already repeated n times)."""
        requests = requests_from_rows(rows, self.next_rid)
        self.queue.extend(requests)
        self.next_rid += len(requests)
        return len(requests)

    @property
    def busy(self) -> bool:
        return bool(self.queue or self.active)

    def abort(self) -> int:
        """Drop every request not finished; returns how many."""
        dropped = len(self.queue) + len(self.active)
        self.queue.clear()
        self.active.clear()
        return dropped

    def take_finished(self) -> list[Request]:
        done, self.finished = self.finished, []
        return done

    # ------------------------------------------------------------------ steps
    def weights_changed(self, version: int, partial: bool) -> None:
        """New weights landed (between two steps): abort and re-queue the sequences in
        flight unless partial rollouts let them continue."""
        if self.version is not None and version != self.version and not partial:
            for req in reversed(self.active):
                self.counts["aborted_tokens"] += len(req.tokens)
                self.counts["restarts"] += 1
                req.tokens, req.logps, req.versions = [], [], []
                req.kv, req.kv_version = None, None
                req.restarts += 1
                self.queue.appendleft(req)
            self.active = []
        self.version = version

    @torch.no_grad()
    def step(self, version: int, partial: bool) -> None:
        """One decode step of every active sequence with the weights of `version`."""
        self.weights_changed(version, partial)
        while len(self.active) < self.slots and self.queue:
            self.active.append(self.queue.popleft())
        if not self.active:
            return
        tokens, logps = self._sample(self._next_scores())
        still = []
        for req, tok, logp in zip(self.active, tokens.tolist(), logps.tolist()):
            req.tokens.append(tok)
            req.logps.append(logp)
            req.versions.append(version)
            ended = tok in self.eos or len(req.tokens) >= self.opts.max_new_tokens
            (self.finished if ended else still).append(req)
            if ended and len(set(req.versions)) > 1:
                self.counts["mixed_rows"] += 1
        self.active = still
        self.counts["decode_steps"] += 1

    def _next_scores(self) -> torch.Tensor:
        """The processed next-token scores [B, V] of the active sequences (warpers
        applied: the distribution a token is sampled from). A sequence whose cache the
        current weights computed decodes its newest token; the others are prefilled."""
        stale = [i for i, r in enumerate(self.active)
                 if r.kv is None or r.kv_version != self.version]
        fresh = [i for i in range(len(self.active)) if i not in set(stale)]
        logits: list[torch.Tensor] = [torch.empty(0)] * len(self.active)
        was_training = self.module.training
        self.module.eval()
        try:
            if stale:
                rows, caches = prefill(self.module, [self._sequence(i) for i in stale],
                                       self.pad, self.device)
                self._keep(stale, rows, caches, logits)
            if fresh:
                rows, caches = decode(self.module, [self.active[i].kv for i in fresh],
                                      [self.active[i].tokens[-1] for i in fresh], self.device)
                self._keep(fresh, rows, caches, logits)
        finally:
            self.module.train(was_training)
        scores = torch.stack(logits).float()
        if self.warpers:  # warpers read the whole sequences (repetition penalties)
            seqs = [self._sequence(i) for i in range(len(self.active))]
            width = max(len(s) for s in seqs)
            ids = torch.tensor([[self.pad] * (width - len(s)) + s for s in seqs],
                               device=scores.device)
            for warper in self.warpers:
                scores = warper(ids, scores)
        return scores

    def _sequence(self, i: int) -> list[int]:
        req = self.active[i]
        return req.prompt + req.tokens

    def _keep(self, which: list[int], rows: torch.Tensor, caches: list,
              logits: list[torch.Tensor]) -> None:
        """Each sequence's logits for this step, and its grown cache."""
        for row, i, kv in zip(rows, which, caches):
            logits[i] = row
            self.active[i].kv, self.active[i].kv_version = kv, self.version

    def _sample(self, scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logp = torch.log_softmax(scores, dim=-1)
        if self.opts.do_sample:
            tokens = torch.multinomial(logp.exp(), 1, generator=self.generator).squeeze(-1)
        else:
            tokens = scores.argmax(-1)
        chosen = torch.gather(logp, -1, tokens.unsqueeze(-1)).squeeze(-1)
        return tokens.cpu(), torch.nan_to_num(chosen, neginf=0.0).cpu()

    # ----------------------------------------------------------------- output
    def assemble(self, done: list[Request]) -> Batch:
        return assemble_requests(done, self.pad, self.eos_id, self.opts.max_new_tokens)


def assemble_requests(done: list[Request], pad: int, eos_id, width: int) -> Batch:
    """Finished requests as the generate node's rows (the engine columns, the prompt's
    columns, `policy_version` = the version of the oldest token) plus `token_versions`
    [B, width] (NO_TOKEN on padding). Shared by every streaming engine.

    Prompts are left-padded to the width they were submitted with (the loader's fixed
    width in a streaming run), not to the widest prompt that happened to finish in
    this poll: rows of different polls, and the samples of one group finished in
    different polls, then concatenate."""
    plen = max(max(len(r.prompt), r.width) for r in done)
    prompt_ids = torch.full((len(done), plen), pad, dtype=torch.long)
    prompt_mask = torch.zeros((len(done), plen), dtype=torch.long)
    responses = torch.full((len(done), width), pad, dtype=torch.long)
    logps = torch.zeros((len(done), width), dtype=torch.float32)
    versions = torch.full((len(done), width), NO_TOKEN, dtype=torch.long)
    for i, req in enumerate(done):
        prompt_ids[i, plen - len(req.prompt):] = torch.tensor(req.prompt)
        prompt_mask[i, plen - len(req.prompt):] = 1
        n = min(len(req.tokens), width)
        responses[i, :n] = torch.tensor(req.tokens[:n])
        logps[i, :n] = torch.tensor(req.logps[:n])
        versions[i, :n] = torch.tensor(req.versions[:n])
    prompts = Batch({"input_ids": prompt_ids, "attention_mask": prompt_mask})
    rollout = assemble_rollout(prompts, responses, pad, eos_id, logps)
    out = Batch.concat([r.row for r in done]).update(rollout)
    out[TOKEN_VERSIONS] = torch.where(rollout["response_mask"].bool(), versions,
                                        torch.full_like(versions, NO_TOKEN))
    out[POLICY_VERSION] = torch.tensor([min(r.versions) for r in done], dtype=torch.long)
    return out
