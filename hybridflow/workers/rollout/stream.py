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

The active sequences share one KV cache kept across steps (`stream_cache.SlotCache`,
rows in `active` order): a decode step runs the model on one new token per sequence,
so its work is flat in the prefix length, and rows are added or removed only when a
request joins or leaves. The cache is computed by one weights version: new requests
are prefilled with the current weights before they join it, and after a weight update
the sequences in flight (a partial rollout continuing) are prefilled again with the
new weights, so every token is sampled from exactly the weights it is stamped with.

Tokens are drawn and their log-probs read as the engine's batched loop does
(hf_decode.py: the warpers' processed log-probs, one uniform a row inverted through the
CDF), from the loop's own generator (seeded by the worker), so on the local runtime,
where the steps interleave with training in a fixed order, the same seed gives the same
tokens and versions. `rollout.hf_loop=generate` draws with `torch.multinomial` from the
same generator, as the loop did before (the tokens a seed drew then).

What a request holds, the finished list, the counters, a restart and the rows a
poll hands back are every engine's stream's (engine_stream.RequestStream, its base).

State: `queue` (waiting requests), `active` (those in slots), `cache` (theirs),
`finished`, `version` (the last version a step sampled with), counters. Only its
methods change it.
"""
from __future__ import annotations

from collections import deque
from contextlib import contextmanager

import torch

from hybridflow.core.batch import Batch
from hybridflow.core.columns import NO_TOKEN
from hybridflow.workers.rollout.engine_stream import (Request, RequestStream,
                                                      assemble_requests, requests_from_rows)
from hybridflow.workers.rollout.hf_decode import processed_log_probs, sample
from hybridflow.workers.rollout.stream_cache import SlotCache, prefill

# Request and the two helpers live in engine_stream.py (every engine's); named here too
__all__ = ["StreamLoop", "Request", "NO_TOKEN", "requests_from_rows", "assemble_requests"]



class StreamLoop(RequestStream):
    def __init__(self, module, tokenizer, device, opts, seed: int, warpers=()):
        super().__init__(opts, tokenizer)
        self.module, self.device = module, device
        self.warpers = list(warpers)  # the engine's sampling warpers for `opts`
        eos = tokenizer.eos_token_id
        self.eos = set(eos if isinstance(eos, (list, tuple)) else [eos])
        self.slots = opts.micro_batch_size
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(int(seed))
        self.queue: deque[Request] = deque()
        self.active: list[Request] = []
        self.cache = SlotCache()

    # --------------------------------------------------------------- requests
    def submit(self, rows: Batch) -> int:
        """Queue one request per row (rows already repeated n times)."""
        requests = self._requests(rows)
        self.queue.extend(requests)
        return len(requests)

    @property
    def busy(self) -> bool:
        return bool(self.queue or self.active)

    def abort(self) -> int:
        """Drop every request not finished; returns how many."""
        dropped = len(self.queue) + len(self.active)
        self.queue.clear()
        self.active.clear()
        self.cache.clear()
        return dropped

    # ------------------------------------------------------------------ steps
    def weights_changed(self, version: int, partial: bool) -> None:
        """New weights landed (between two steps): abort and re-queue the sequences in
        flight unless partial rollouts let them continue."""
        if self.version is not None and version != self.version and not partial:
            for req in reversed(self.active):
                self._restart(req)
                self.queue.appendleft(req)
            self.active = []
            self.cache.clear()
        self.version = version

    @torch.no_grad()
    def step(self, version: int, partial: bool | None = None) -> None:
        """One decode step of every active sequence with the weights of `version`
        (`partial`: whether sequences in flight continue across new weights; None:
        `rollout.partial`, the options')."""
        self.weights_changed(version, self.opts.partial if partial is None else partial)
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
            if tok in self.eos or len(req.tokens) >= self.opts.max_new_tokens:
                self._finish(req)
            else:
                still.append(req)
        if len(still) < len(self.active):  # rows that ended leave the cache
            kept = set(map(id, still))
            self.cache.keep(torch.tensor([i for i, r in enumerate(self.active) if id(r) in kept],
                                         dtype=torch.long, device=self.cache.mask.device))
        self.active = still
        self.counts["decode_steps"] += 1

    def _next_scores(self) -> torch.Tensor:
        """The next-token log-probs [B, V] of the active sequences, warpers applied (the
        distribution a token is sampled from), in `active` order. The cached rows decode
        their newest token; the others (new requests, or every row after a weight
        update) are prefilled and join the cache after them."""
        if self.cache.rows and self.cache.version != self.version:
            self.cache.clear()  # older weights computed it: prefill every row again
        cached = self.active[:self.cache.rows]
        joining = self.active[self.cache.rows:]
        with _evaluating(self.module):
            logits = []
            if cached:
                last = torch.tensor([r.tokens[-1] for r in cached], device=self.device)
                logits.append(self.cache.decode(self.module, last))
            if joining:
                rows, cache, mask = prefill(self.module, [r.prompt + r.tokens for r in joining],
                                            self.pad, self.device)
                self.cache.join(cache, mask, self.version)
                logits.append(rows)
        ids = self._ids() if self.warpers else None
        return processed_log_probs(torch.cat(logits), ids, self.warpers)

    def _ids(self) -> torch.Tensor:
        """Each row's tokens so far, left-padded: what the batched loop hands the
        warpers (sampled_warpers' ignore them; built only when there are warpers)."""
        width = max(len(r.tokens) for r in self.active)
        return torch.tensor([[self.pad] * (width - len(r.tokens)) + r.tokens
                             for r in self.active], dtype=torch.long, device=self.device)

    def _sample(self, logp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.opts.do_sample:
            tokens = logp.argmax(-1)
        elif self.opts.hf_loop == "generate":  # the draws of the loop before hf_decode's
            tokens = torch.multinomial(logp.exp(), 1, generator=self.generator).squeeze(-1)
        else:
            tokens = sample(logp, self.generator)
        chosen = torch.gather(logp, -1, tokens.unsqueeze(-1)).squeeze(-1)
        return tokens.cpu(), torch.nan_to_num(chosen, neginf=0.0).cpu()


@contextmanager
def _evaluating(module):
    """The module in eval mode for a step: switched (and back) only when it trains (a
    module shared with the actor); walking the modules every step cost a tenth of a
    small model's decode step."""
    if not module.training:
        yield
        return
    module.eval()
    try:
        yield
    finally:
        module.train(True)
