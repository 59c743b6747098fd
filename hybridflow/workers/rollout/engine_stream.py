"""The streaming half every built-in engine shares (`trainer.async_mode=streaming`;
the `StreamingEngine` members of engine.py), in two layers:

- `RequestStream`, the base of each engine's request loop (`stream.StreamLoop` for
  `hf`: continuous batching over the module; `vllm_stream.VLLMStream`: requests in
  vLLM's own engine): what a request holds (`Request`: tokens, behaviour log-probs,
  the version of each token), ids in submission order, the finished list, the
  counters, a restart (a response dropped for new weights: `partial=False`) and the
  rows a poll hands back (`assemble_requests`, one layout for every engine, so rows
  of different polls and engines concatenate).
- `EngineStream`, mixed into each engine (`HFEngine`, `VLLMEngine`): one stream
  per engine, built at the first submit with its sampling options (later ones must
  match), `poll` (up to `max_steps` steps with the weights held now, then the rows
  that finished), `abort`, `stream_busy`, `stream_counts`. An engine gives
  `_open_stream(opts)` and, when its stream's calls need a context (vLLM's process
  state), `_entered()`.

State: a `RequestStream`'s `finished`, `version` (the weights of its last step),
`next_rid` and `counts` (its subclass keeps where requests wait); an engine's
`_stream` (None until the first submit). Only their methods change them.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

from hybridflow.core.batch import Batch
from hybridflow.core.columns import NO_TOKEN, POLICY_VERSION, TOKEN_VERSIONS
from hybridflow.workers.rollout.generation import assemble_rollout

__all__ = ["Request", "requests_from_rows", "assemble_requests", "RequestStream",
           "EngineStream"]


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


def requests_from_rows(rows: Batch, first_rid: int) -> list[Request]:
    """One request per row (rows already repeated n times): the prompt without its
    padding, the row's other columns; ids from `first_rid` on."""
    ids, mask = rows["input_ids"], rows["attention_mask"].bool()
    others = rows.select(*[k for k in rows.keys()
                           if k not in ("input_ids", "attention_mask", "position_ids")])
    return [Request(first_rid + i, ids[i][mask[i]].tolist(), others.take(i), ids.shape[1])
            for i in range(len(rows))]


def assemble_requests(done: list[Request], pad: int, eos_id, width: int) -> Batch:
    """Finished requests as the generate node's rows (the engine columns, the prompt's
    columns, `policy_version` = the version of the oldest token) plus `token_versions`
    [B, width] (NO_TOKEN on padding). Shared by every streaming engine.

    Prompts are left-padded to the width they were submitted with (the loader's fixed
    width in a streaming run), not to the widest prompt that happened to finish in
    this poll: rows of different polls, and the samples of one group finished in
    different polls, then concatenate."""
    plen = max(max(len(r.prompt), r.width) for r in done)
    # whole rows as lists, then one tensor each (a tensor a row was a tenth of the loop)
    prompt_ids = torch.tensor([[pad] * (plen - len(r.prompt)) + r.prompt for r in done],
                              dtype=torch.long)
    prompt_mask = torch.tensor([[0] * (plen - len(r.prompt)) + [1] * len(r.prompt)
                                for r in done], dtype=torch.long)
    fill = [width - min(len(r.tokens), width) for r in done]
    responses = torch.tensor([r.tokens[:width] + [pad] * f for r, f in zip(done, fill)],
                             dtype=torch.long)
    logps = torch.tensor([r.logps[:width] + [0.0] * f for r, f in zip(done, fill)],
                         dtype=torch.float32)
    versions = torch.tensor([r.versions[:width] + [NO_TOKEN] * f for r, f in zip(done, fill)],
                            dtype=torch.long)
    prompts = Batch({"input_ids": prompt_ids, "attention_mask": prompt_mask})
    rollout = assemble_rollout(prompts, responses, pad, eos_id, logps)
    out = Batch.concat([r.row for r in done]).update(rollout)
    out[TOKEN_VERSIONS] = torch.where(rollout["response_mask"].bool(), versions,
                                      torch.full_like(versions, NO_TOKEN))
    out[POLICY_VERSION] = torch.tensor([min(r.versions) for r in done], dtype=torch.long)
    return out


class RequestStream:
    """What both request loops keep; a subclass adds where requests wait, `busy`,
    `submit`, `step(version)` and `abort`."""
    COUNTS = ("aborted_tokens", "restarts", "mixed_rows", "decode_steps")

    def __init__(self, opts, tokenizer):
        self.opts = opts
        self.pad, self.eos_id = tokenizer.pad_token_id, tokenizer.eos_token_id
        self.finished: list[Request] = []
        self.version: int | None = None
        self.next_rid = 0
        self.counts = {k: 0 for k in self.COUNTS}

    def _requests(self, rows: Batch) -> list[Request]:
        """One request per row, ids in submission order."""
        requests = requests_from_rows(rows, self.next_rid)
        self.next_rid += len(requests)
        return requests

    def _restart(self, req: Request) -> None:
        """Drop a response's tokens (new weights, not continued); counted."""
        self.counts["aborted_tokens"] += len(req.tokens)
        self.counts["restarts"] += 1
        req.tokens, req.logps, req.versions = [], [], []
        req.restarts += 1

    def _finish(self, req: Request) -> None:
        """A response that ended; counted when tokens of several versions made it."""
        self.finished.append(req)
        if len(set(req.versions)) > 1:
            self.counts["mixed_rows"] += 1

    def take_finished(self) -> list[Request]:
        done, self.finished = self.finished, []
        return done

    def assemble(self, done: list[Request]) -> Batch:
        return assemble_requests(done, self.pad, self.eos_id, self.opts.max_new_tokens)


class EngineStream:
    """The `StreamingEngine` members an engine shares (see the module docstring)."""
    _stream: RequestStream | None = None

    def _open_stream(self, opts) -> RequestStream:
        raise NotImplementedError(f"{type(self).__name__} must build its stream")

    def _entered(self):
        """The context the stream's calls run in (none by default)."""
        return contextlib.nullcontext()

    def _stream_for(self, opts) -> RequestStream:
        """The engine's stream, built at the first submit; one set of options."""
        if self._stream is None:
            self._stream = self._open_stream(opts)
        elif self._stream.opts != opts:
            raise ValueError("a streaming rollout samples with one set of options; got "
                             f"{opts} after {self._stream.opts}")
        return self._stream

    def poll(self, max_steps: int) -> Batch | None:
        """Up to `max_steps` steps with the weights held now (their `policy_version`);
        the rows that finished, or None."""
        stream = self._stream
        if stream is None:
            return None
        with self._entered():
            for _ in range(max_steps):
                if not stream.busy:
                    break
                stream.step(self.policy_version)
        done = stream.take_finished()
        return stream.assemble(done) if done else None

    def abort(self) -> int:
        """Drop the requests not finished (queued and in flight); how many."""
        if self._stream is None:
            return 0
        with self._entered():
            return self._stream.abort()

    @property
    def stream_busy(self) -> bool:
        return self._stream is not None and self._stream.busy

    def stream_counts(self) -> dict:
        return dict(self._stream.counts) if self._stream is not None else {}
