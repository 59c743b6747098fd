"""Streaming rollout for the `vllm` engine (`trainer.async_mode=streaming`): requests
live in vLLM's own engine (`LLM.llm_engine`: `add_request`, `step`, `abort_request`)
across weight updates.

A `VLLMStream` keeps, per request, what was sampled so far (the shared
`engine_stream.Request`: tokens, behaviour log-probs, the version of each token; the
finished list, counters, restarts and the rows a poll returns are its base's,
`engine_stream.RequestStream`, as the `hf` engine's loop's). Requests
are added to vLLM with `RequestOutputKind.DELTA`, so each `step()` returns only the
tokens sampled in that step: each is stamped with the version of the weights held
during that step.

A weight update while requests are in flight (`interrupt` before the new weights are
final, `resume(version)` after): every live request is aborted in vLLM, so nothing
runs on KV computed with the old weights and the prefix cache can be reset (vLLM
refuses that while requests run), then re-added:
- `partial=True` (partial rollout): with the prompt plus the tokens sampled so far as
  its prompt and the remaining token budget; vLLM re-prefills them with the new
  weights and sampling continues, so the tokens after the update are the new
  policy's, with their own log-probs, and the earlier ones keep theirs;
- `partial=False`: from its prompt alone, its tokens dropped (counted).
This is the abort-and-resume of verl's and AReaL's partial rollouts, not a
continuation on stale KV.

Each (re-)addition has its own request id (`rid-attempt`) and, when sampling, a seed
derived from the run's seed, the request and how many tokens it holds, so the draws
do not depend on which requests share a step and a continuation does not replay the
draws of its start.

State: `live` (external request id -> request, in vLLM now), `finished`, `version`
(the weights of the last step), `attempts`, `counts`. Only its methods change it; the
engine calls them inside its process-state swap (vllm_process.py).
"""
from __future__ import annotations

from hybridflow.core.batch import Batch
from hybridflow.workers.rollout.engine_stream import Request, RequestStream

__all__ = ["VLLMStream"]


class VLLMStream(RequestStream):
    COUNTS = (*RequestStream.COUNTS, "resumed")

    def __init__(self, llm_engine, make_params, delta_kind, opts, tokenizer, seed: int,
                 base_kwargs: dict):
        """`base_kwargs`: the SamplingParams kwargs of `opts` (vllm.sampling_kwargs);
        each request gets its own token budget, seed and DELTA outputs on top."""
        super().__init__(opts, tokenizer)
        self.engine, self.make_params, self.delta_kind = llm_engine, make_params, delta_kind
        self.seed, self.base_kwargs = int(seed), dict(base_kwargs)
        self.live: dict[str, Request] = {}
        self.attempts = 0

    @property
    def busy(self) -> bool:
        return bool(self.live)

    # --------------------------------------------------------------- requests
    def submit(self, rows: Batch) -> int:
        requests = self._requests(rows)
        for req in requests:
            self._add(req)
        return len(requests)

    def _params(self, req: Request):
        kwargs = {**self.base_kwargs, "output_kind": self.delta_kind,
                  "max_tokens": self.opts.max_new_tokens - len(req.tokens)}
        if self.opts.do_sample:  # per-request draws: independent of the step's company
            kwargs["seed"] = (self.seed * 1_000_003 + req.rid * 7_919 + len(req.tokens)
                              + 104_729 * req.restarts) % (2 ** 31)
        return self.make_params(**kwargs)

    def _add(self, req: Request) -> None:
        rid = f"stream-{req.rid}-{self.attempts}"
        self.attempts += 1
        self.engine.add_request(rid, {"prompt_token_ids": req.prompt + req.tokens},
                                self._params(req))
        self.live[rid] = req

    def abort(self) -> int:
        """Drop every request not finished (in vLLM too); how many."""
        dropped = len(self.live)
        if self.live:
            self.engine.abort_request(list(self.live))
        self.live.clear()
        return dropped

    # ---------------------------------------------------------------- weights
    def interrupt(self) -> list[Request]:
        """Take every live request out of vLLM (before new weights become final and the
        prefix cache is reset); returns them for `resume`."""
        held = list(self.live.values())
        self.abort()
        return held

    def resume(self, held: list[Request], partial: bool) -> None:
        """Re-add the interrupted requests under the new weights, continuing from their
        tokens (partial) or from their prompts (their tokens dropped)."""
        for req in held:
            if partial:
                self.counts["resumed"] += 1
            else:
                self._restart(req)
            self._add(req)

    # ------------------------------------------------------------------ steps
    def step(self, version: int) -> None:
        """One vLLM engine step; its new tokens are stamped with `version`."""
        self.version = version
        for out in self.engine.step():
            req = self.live.get(out.request_id)
            if req is None:  # aborted after it was scheduled
                continue
            sample = out.outputs[0]
            tokens = list(sample.token_ids)
            ranked = list(sample.logprobs or [])
            for i, tok in enumerate(tokens):
                req.tokens.append(int(tok))
                req.logps.append(float(ranked[i][tok].logprob) if i < len(ranked) else 0.0)
                req.versions.append(version)
            if out.finished:
                del self.live[out.request_id]
                self._finish(req)
        self.counts["decode_steps"] += 1
