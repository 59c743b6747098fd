"""Bytes of one pass of one role on one device: training state, activations of a
micro-batch, logits, KV cache. Pure arithmetic over `ModelSize`; stateless.

Where the constants come from (transformers 5.x, torch 2.x, HF Llama/Qwen2 layers,
sdpa attention; bench/memory.py checks them against measured peaks):

- **Saved activations** of a forward that will be backpropagated, per token and
  per layer, in the model's dtype: `4 * intermediate` (the MLP keeps gate, up,
  silu(gate) and their product), `10.5 * hidden` (the two RMSNorms keep their input
  and output; q, k, v after the projections and after rotary; sdpa's output and its
  contiguous copy; the residual stream), and `width` more elements for the padding
  mask sdpa keeps per layer (`[rows, 1, width, width]`) where there is one (packed
  rows, `model.use_remove_padding` with sdpa_varlen, run maskless and keep none:
  `MicroBatch.masked`; a maskless 4K row of SmolLM2's shapes measured 4i + 10.5h
  within 5 %, bench/sequence_parallel.py). Measured with autograd's saved-tensor
  hooks: 4i + 10.4h + width on every shape tried, independent of the number of KV
  heads. In bf16 the RMSNorms also keep float32 copies (+2.2h). With
  LoRA (adapters on q/k/v/o, the default) the frozen MLP projections and norm
  weights keep less (3i + 7.3h), and in bf16 peft's float32 adapter inputs add back
  (3i + 16.5h). `ACT_PER_TOKEN_LAYER` holds the four fits. The bf16 ones were
  fitted on pure-bf16 training, before the trainer moved to autocast over float32
  master weights: bench/memory.py finds them within -3 to +6 % (refit to tighten).
- **Logits.** The response log-probs read `[rows, R + 1, vocab]` logits (the model
  computes only those: `logits_to_keep`). Training holds four float32 copies at the
  start of the backward (the logits, the log-softmax's gradient, the gather's
  scattered gradient and the slice's padded gradient), one more for a temperature
  other than 1; a bf16 model's own logits are freed by then (measured). An
  inference pass holds two (the logits and logsumexp's exp); the layers'
  temporaries are gone by then, so it is the larger of the two, not their sum.
  With chunked log-probs (`*.logprob_chunk`, `workers/chunked_logprobs.py`) the same
  copies span one chunk of positions, not the micro-batch's (`MicroBatch.logit_chunk`;
  the backward recomputes one chunk at a time). Under sequence parallelism a rank
  computes the logits of its own slice's positions only (at most `width / sp` of a
  row; the last rank holds the most response positions), chunked the same way.
  A value head has one output per token: no vocab term.
- **Training state.** The trainer gives a bf16/fp16 model float32 master weights
  (its trainable parameters are upcast in place; `model_size(trained=True)` runs
  the same function on the meta model) and computes under autocast, which keeps a
  16-bit copy of each cast weight until the backward ends. AdamW's gradients and
  moments are float32 then, plus a float32 `step` per tensor; frozen weights (LoRA's
  base, the reference) stay in `model.dtype`. Under autocast the log-prob pass also
  holds the 16-bit logits beside their float32 copies. Gradients are live during
  every micro-batch after the first (accumulation), so the update's peak counts
  them in full. The optimizer
  step adds temporaries: one copy of the largest tensor (single-tensor AdamW, the
  CPU default) or of all trainable bytes (foreach AdamW, the CUDA default).
- **generate**: the KV cache, `rows * (prompt + response) * layers * 2 * kv_heads
  * head_dim * dtype bytes`, plus one layer's keys again (the cache grows by
  concatenation), and the sampling's float32 `[rows, vocab]` tensors (four: logits,
  processed scores, probabilities, a copy); or the prefill's temporaries when
  larger. The `hf` engine's log-prob recorder (`ChosenLogProbs`) adds one more: the
  step's log-softmax, kept until the next step reads the chosen token from it (it
  no longer keeps every step's scores: `rows * response * vocab` float32 over-counted
  a 49k-vocabulary model's generate ~2.5x, bench/real_model_memory.py).
- **Inference** (log-probs, values): one layer's temporaries (3 intermediate + 4
  hidden per token) or the logits, whichever is larger.
"""
from __future__ import annotations

from dataclasses import dataclass

from hybridflow.memory.model_size import ModelSize

__all__ = ["MicroBatch", "training_state", "saved_activations", "logits_bytes",
           "kv_cache_bytes", "train_pass", "inference_pass", "generate_pass",
           "batch_bytes", "ACT_PER_TOKEN_LAYER"]

# (hidden-sized, intermediate-sized) tensors a layer keeps per token for the backward,
# by (adapters only train, 16-bit dtype); fitted with saved-tensor hooks, see above
ACT_PER_TOKEN_LAYER = {(False, False): (10.5, 4), (False, True): (12.7, 4),
                       (True, False): (7.3, 3), (True, True): (16.5, 3)}
FP32 = 4


@dataclass(frozen=True)
class MicroBatch:
    """One forward's rows and widths: `[rows, prompt + response]` tokens, padded."""
    rows: int
    prompt: int
    response: int
    full_logits: bool = False  # logits over every position (SFT), not only the response
    logit_chunk: int | None = None  # positions per chunk of log-probs (None: whole rows)
    sp: int = 1  # sequence-parallel ranks: each runs width / sp positions of every layer
    masked: bool = True  # a padding mask per layer (False: packed rows, no mask)

    @property
    def local_width(self) -> int:
        """Positions a rank's layers hold: the row padded to a multiple of sp, over sp."""
        return -(-self.width // self.sp)

    @property
    def width(self) -> int:
        return self.prompt + self.response

    @property
    def logit_positions(self) -> int:
        """Positions of a row whose logits a rank computes: the response's (and the one
        before it) or all (SFT); under sp those of its own slice, at most `local_width`
        (each rank reduces its slice's log-probs: workers/sequences.head_stats)."""
        positions = self.width if self.full_logits else self.response + 1
        return min(positions, self.local_width) if self.sp > 1 else positions

    @property
    def held_logit_positions(self) -> int:
        """Positions whose vocab-wide logits are alive at once: all, or one chunk."""
        positions = self.rows * self.logit_positions
        return min(positions, self.logit_chunk) if self.logit_chunk else positions


def training_state(size: ModelSize, cuda: bool = False, shards: int = 1,
                   ddp_buckets: bool = False) -> dict[str, int]:
    """Gradients, AdamW moments and the optimizer step's temporaries of a trained
    model (weights are resident and counted apart). `shards`: FSDP's data-parallel
    degree (each rank keeps 1/shards); `ddp_buckets`: DDP over >1 rank keeps a
    second copy of the gradients in its communication buckets."""
    grads = size.trainable_bytes // shards
    moments = 2 * size.trainable_bytes // shards + FP32 * size.trainable_tensors
    step_tmp = grads if cuda else 2 * size.largest_trainable_bytes
    out = {"gradients": grads, "optimizer": moments, "optimizer step": step_tmp}
    if ddp_buckets:
        out["ddp buckets"] = grads
    return out


def saved_activations(size: ModelSize, micro: MicroBatch, checkpointing: bool = False) -> int:
    """What a forward keeps for its backward, over all layers."""
    arch = size.arch
    adapters_only = size.trainable < size.params
    hidden, inter = ACT_PER_TOKEN_LAYER[(adapters_only, size.dtype_bytes < FP32)]
    per_token_layer = inter * arch.intermediate + hidden * arch.hidden + \
        (micro.width if micro.masked else 0)
    tokens = micro.rows * micro.local_width  # under sp a rank's queries attend all width
    if checkpointing:  # keeps each layer's input; one layer is recomputed at a time
        return int(tokens * size.dtype_bytes * (arch.layers * arch.hidden + per_token_layer))
    return int(tokens * arch.layers * per_token_layer * size.dtype_bytes)


def logits_bytes(size: ModelSize, micro: MicroBatch, train: bool,
                 temperature: float = 1.0) -> int:
    """The vocab-wide float32 tensors alive at the peak of a log-prob pass."""
    elems = micro.held_logit_positions * size.arch.vocab
    fp32_copies = 4 if train else 2
    if temperature != 1.0:
        fp32_copies += 1
    return elems * fp32_copies * FP32


def kv_cache_bytes(size: ModelSize, rows: int, length: int) -> int:
    """Keys and values of every layer for `rows` sequences of `length` tokens."""
    arch = size.arch
    return rows * length * arch.layers * 2 * arch.kv_heads * arch.head_dim * size.dtype_bytes


def layer_transients(size: ModelSize, micro: MicroBatch) -> int:
    """One layer's temporaries in a forward without gradient (inference, prefill):
    the MLP's silu(gate), up and their product (3 intermediate) beside the residual
    stream, the normed input and the attention output (~4 hidden)."""
    arch = size.arch
    return micro.rows * micro.local_width * (3 * arch.intermediate + 4 * arch.hidden) \
        * size.dtype_bytes


def batch_bytes(rows: int, prompt: int, response: int) -> int:
    """A rank's shard of the step's batch: int64 ids, mask and positions over the
    full width, int64 responses and mask and ~5 float32 columns over the response."""
    width = prompt + response
    return rows * (3 * 8 * width + (2 * 8 + 5 * FP32) * response)


def _autocast(size: ModelSize) -> bool:
    """A 16-bit model with float32 master weights: the trainer computes under autocast."""
    return size.dtype_bytes < FP32 and size.trainable > 0 and \
        size.trainable_bytes == FP32 * size.trainable


def train_pass(size: ModelSize, micro: MicroBatch, vocab_head: bool = True,
               temperature: float = 1.0, checkpointing: bool = False,
               **state) -> dict[str, int]:
    """Transient bytes of an update (forward, backward, optimizer step) beyond the
    resident weights and moments; `state` goes to `training_state`."""
    train = training_state(size, **state)
    forward = {"activations": saved_activations(size, micro, checkpointing)}
    if vocab_head:
        forward["logits"] = logits_bytes(size, micro, train=True, temperature=temperature)
    if _autocast(size):
        # autocast keeps a low-precision copy of each float32 master weight it casts
        # for the forward, until the backward is done
        forward["autocast copies"] = size.trainable * size.dtype_bytes
    step = train.pop("optimizer step")
    # the step's temporaries come after the backward has freed the activations
    phase = forward if sum(forward.values()) >= step else {"optimizer step": step}
    return {"gradients": train["gradients"], **phase,
            **({"ddp buckets": train["ddp buckets"]} if "ddp buckets" in train else {})}


def inference_pass(size: ModelSize, micro: MicroBatch, vocab_head: bool = True,
                   temperature: float = 1.0, prepacked: bool = False) -> dict[str, int]:
    """Transient bytes of a forward without gradient (log-probs, values, scores):
    the larger of one layer's temporaries and the logits, which never coexist.
    `prepacked` (`actor.prepacked_linear`, `ref.prepacked_linear`): a float32 model's
    weights again, in oneDNN's layout, for the whole call."""
    layer = layer_transients(size, micro)
    logits = logits_bytes(size, micro, train=False, temperature=temperature) \
        if vocab_head else 0
    if logits and _autocast(size):  # the low-precision logits live beside their copies
        logits += micro.held_logit_positions * size.arch.vocab * size.dtype_bytes
    peak = {"logits": logits} if logits >= layer else {"activations": layer}
    if prepacked and size.dtype_bytes == FP32:
        peak["prepacked weights"] = size.weight_bytes
    return peak


def generate_pass(size: ModelSize, rows: int, prompt: int, response: int,
                  records_logprobs: bool = True, prepacked: bool = False) -> dict[str, int]:
    """Transient bytes of HF `generate` for `rows` sequences: the larger of the
    prefill (the prompt's KV cache and one layer's temporaries) and the last decoding
    step (the full KV cache, one layer of it again while it grows by concatenation,
    the sampling's float32 `[rows, vocab]` tensors: four, and a fifth when the engine
    records the chosen tokens' log-probs, `records_logprobs`: the `hf` engine keeps
    one step's log-softmax at a time). The recorded log-probs themselves are
    `[rows, response]` float32, negligible beside these. `prepacked`
    (`rollout.prepacked_linear`, workers/rollout/prepacked.py): a float32 model's
    weights again, in oneDNN's layout, for the whole call."""
    cache = kv_cache_bytes(size, rows, prompt + response)
    vocab_tensors = 4 + (1 if records_logprobs else 0)
    phases = [
        {"kv cache": kv_cache_bytes(size, rows, prompt),
         "activations": layer_transients(size, MicroBatch(rows, prompt, 0))},
        {"kv cache": cache + cache // (2 * size.arch.layers),
         "sampling": vocab_tensors * rows * size.arch.vocab * FP32},
    ]
    peak = max(phases, key=lambda parts: sum(parts.values()))
    if prepacked and size.dtype_bytes == FP32:
        peak = {**peak, "prepacked weights": size.weight_bytes}
    return peak
