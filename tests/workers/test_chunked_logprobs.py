"""Chunked log-probs (`actor.logprob_chunk`, `ref.logprob_chunk`; workers/chunked_logprobs.py):
the log-probs, entropy and gradients computed a chunk of positions at a time equal the
whole-logits ones to 1e-6 in fp32 (padded and packed, a temperature, a chunk that does not
divide the positions), in actor.update, actor.logprob and ref.logprob; no tensor of the
chunked forward or backward holds more than a chunk's positions of vocabulary-wide values;
small vocabularies (the toy) never chunk by default; a head its forward rescales keeps the
whole-logits path. The tensor-parallel (vocab-parallel head) and FSDP2 cases are in
test_chunked_logprobs_dist.py."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoConfig, AutoModelForCausalLM

from tests.support.workers import MODELS, make_cfg, rollout_for_update
from hybridflow.core.batch import Batch
from hybridflow.workers import ActorWorker, ReferenceWorker
from hybridflow.workers.chunked_logprobs import AUTO_CHUNK_ELEMENTS, chunk_positions, output_head
from hybridflow.workers.loss_inputs import PolicyOutputs, run_loss, worker_default_loss
from hybridflow.workers.sequences import forward_response, position_ids_from_mask

ATOL = 1e-6
# a chunk of 7 positions: divides neither B x R nor a packed row's response tokens
CHUNK = 7


def _model(model_type: str = "llama", vocab: int = 300, hidden: int = 32, **extra):
    torch.manual_seed(0)
    spec = {k: v for k, v in MODELS[model_type].items() if k != "model_type"}
    config = AutoConfig.for_model(model_type, **{**spec, "hidden_size": hidden,
                                                 "vocab_size": vocab, **extra})
    config._attn_implementation = "sdpa"
    return AutoModelForCausalLM.from_config(config).float()


def _batch(vocab: int = 300, rows: int = 3, prompt: int = 5, response: int = 11) -> Batch:
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, vocab, (rows, prompt + response), generator=gen)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0                  # a left-padded prompt
    mask[1, prompt + 7:] = 0         # a response that ends early
    return Batch({"input_ids": ids, "attention_mask": mask,
                  "position_ids": position_ids_from_mask(mask), "responses": ids[:, prompt:],
                  "response_mask": mask[:, prompt:]})


def _grads(model) -> dict:
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return grads


def _forward_and_grads(model, batch, chunk, packed, temperature=0.7):
    logp, ent = forward_response(model, batch, temperature, with_entropy=True, packed=packed,
                                 logprob_chunk=chunk)
    mask = batch["response_mask"].float()
    (((logp + 0.1 * ent) * mask).sum() / mask.sum()).backward()  # a token-mean loss
    return logp.detach(), ent.detach(), _grads(model)


def _close(a, b, what, atol=ATOL):
    assert a.shape == b.shape, what
    assert torch.allclose(a, b, atol=atol, rtol=0), f"{what}: {(a - b).abs().max()}"


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
def test_chunked_log_probs_entropy_and_gradients_equal_whole_logits(model_type, packed):
    model, batch = _model(model_type), _batch()
    whole = _forward_and_grads(model, batch, 0, packed)
    chunked = _forward_and_grads(model, batch, CHUNK, packed)
    _close(chunked[0], whole[0], "log-probs")
    _close(chunked[1], whole[1], "entropy")
    assert whole[2].keys() == chunked[2].keys()
    for name in whole[2]:
        _close(chunked[2][name], whole[2][name], f"gradient of {name}")
    assert whole[2]["lm_head.weight"].abs().max() > 0  # the head really was trained


def test_chunked_without_gradient_equals_whole_logits():
    model, batch = _model(), _batch()
    with torch.no_grad():
        for packed in (False, True):
            whole = forward_response(model, batch, 1.3, True, packed=packed, logprob_chunk=0)
            chunked = forward_response(model, batch, 1.3, True, packed=packed, logprob_chunk=4)
            for a, b, what in zip(chunked, whole, ("log-probs", "entropy")):
                _close(a, b, f"{what} (packed={packed})")


class _VocabWide(TorchDispatchMode):
    """The most positions of any vocabulary-wide tensor an op produced ([..., V])."""

    def __init__(self, vocab: int):
        super().__init__()
        self.vocab, self.most = vocab, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if torch.is_tensor(t) and t.dim() >= 2 and t.shape[-1] == self.vocab:
                self.most = max(self.most, t.shape[:-1].numel())
        return out


@pytest.mark.parametrize("chunk", [0, 20])
def test_no_tensor_holds_more_than_a_chunk_of_logits(chunk):
    """Forward and backward: with chunking no op output spans more than `chunk`
    positions of the vocabulary (the hidden size, 16, is below the chunk, so the head's
    weight and its gradient do not count); without, the logits span every position."""
    vocab = 1000
    model, batch = _model(vocab=vocab, hidden=16), _batch(vocab=vocab, rows=4, response=30)
    positions = batch["responses"].numel()
    with _VocabWide(vocab) as seen:
        logp, ent = forward_response(model, batch, 1.0, with_entropy=True, logprob_chunk=chunk)
        ((logp + 0.1 * ent) * batch["response_mask"]).sum().backward()
    if chunk:
        assert seen.most == chunk
    else:  # rows x (R + 1): the model's own logits, the last position's included
        assert seen.most >= positions


def test_policy_outputs_loss_gradients_equal_whole_logits():
    """The actor's default loss (PPO clip, a KL term, an entropy bonus and the entropy
    metric) through `out.log_probs` / `out.entropy()`: one chunked pass serves them all."""
    cfg = make_cfg(actor={"entropy_coeff": 0.01, "use_kl_loss": True})
    actor = ActorWorker(cfg)
    batch = rollout_for_update(actor, n=2)
    loss = worker_default_loss(actor, "actor.update", actor.actor_cfg)
    mask = batch["response_mask"]
    results = []
    for chunk in (0, 3):
        out = PolicyOutputs(actor.module, batch, mask.sum().double(), torch.tensor(8.0),
                            temperature=0.9, logprob_chunk=chunk)
        value, metrics = run_loss(loss, batch, out)
        value.backward()
        metrics = {k: float(torch.as_tensor(v).detach()) for k, v in metrics.items()}
        results.append((value.detach(), out.log_probs.detach(), out.logits.detach(), metrics,
                        _grads(actor.module)))
    (v0, lp0, lg0, m0, g0), (v1, lp1, lg1, m1, g1) = results
    _close(v1, v0, "loss")
    _close(lp1, lp0, "log-probs")
    _close(lg1, lg0, "logits a loss reads")
    assert m1 == pytest.approx(m0, abs=ATOL)
    for name in g0:
        _close(g1[name], g0[name], f"gradient of {name}")


@pytest.mark.parametrize("packed", [False, True])
def test_workers_chunked_equal_unchunked(packed, monkeypatch):
    """actor.logprob (with entropy), ref.logprob and actor.update at logprob_chunk=4
    against 0: equal log-probs, entropy metric, loss metrics and gradient norm; the
    chunked path ran in each (0: never)."""
    import hybridflow.workers.sequences as sequences
    calls = []  # the training forward (loss_inputs) reduces through sequences.head_stats too
    real = sequences.chunked_token_stats
    monkeypatch.setattr(sequences, "chunked_token_stats",
                        lambda *a, **k: calls.append(a[3]) or real(*a, **k))
    outs = []
    for chunk in (0, 4):
        cfg = make_cfg(actor={"logprob_chunk": chunk, "entropy_coeff": 0.01, "lr": 1e-6,
                              "use_kl_loss": True},
                       ref={"logprob_chunk": chunk})
        cfg["model"]["use_remove_padding"] = packed
        actor = ActorWorker(cfg)
        batch = rollout_for_update(actor, n=2)
        calls.clear()
        logprob = actor.logprob(batch, with_entropy=True)
        ref = ReferenceWorker(cfg).logprob(batch)
        update = actor.update(batch).meta["metrics"]
        # actor.logprob, ref.logprob: one micro-batch of the 8 rows each; update: 4 of 2
        assert calls == ([4] * 6 if chunk else []), calls
        outs.append((logprob, ref, update))
    (lp0, ref0, up0), (lp1, ref1, up1) = outs
    _close(lp1["old_log_probs"], lp0["old_log_probs"], "actor.logprob")
    _close(ref1["ref_log_prob"], ref0["ref_log_prob"], "ref.logprob")
    assert lp1.meta["metrics"]["actor/entropy"] == pytest.approx(
        lp0.meta["metrics"]["actor/entropy"], abs=ATOL)
    for key in ("actor/pg_loss", "actor/entropy", "actor/kl_loss", "actor/grad_norm"):
        assert up1[key] == pytest.approx(up0[key], abs=ATOL, rel=1e-6), key


def test_toy_vocabulary_never_chunks_by_default():
    toy, big = _model(vocab=80), _model(vocab=49152, hidden=8)
    # a chunk holds 209,715 of its positions: far more than any toy micro-batch's
    assert chunk_positions(None, toy, 200_000) is None
    assert chunk_positions(None, big, 4096) == AUTO_CHUNK_ELEMENTS // 49152 == 341
    assert chunk_positions(None, big, 341) is None        # no more than one chunk
    assert chunk_positions(0, big, 4096) is None          # 0: never
    assert chunk_positions(100, toy, 101) == 100


def test_a_rescaled_head_keeps_the_whole_logits_path():
    model = _model("llama")
    assert output_head(model) is model.lm_head
    model.config.final_logit_softcapping = 30.0  # Gemma-2's: the head alone is not the logits
    assert output_head(model) is None
    assert chunk_positions(4, model, 100) is None


def test_logprob_chunk_must_not_be_negative():
    from hybridflow.program.config import build_config
    with pytest.raises(ValueError, match="actor.logprob_chunk"):
        build_config(overrides=["actor.logprob_chunk=-1"])
