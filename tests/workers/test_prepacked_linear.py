"""workers/rollout/prepacked.py: linear layers through oneDNN's packed kernel for the
`hf` engine's generate (`rollout.prepacked_linear`), their results against F.linear's,
what is left alone, and what a generate call leaves behind."""
from __future__ import annotations

import pytest
import torch

from hybridflow.core.batch import Batch

from hybridflow.workers.rollout.prepacked import can_prepack, prepacked_linears

pytestmark = pytest.mark.skipif(not can_prepack(), reason="this torch has no oneDNN linear")


def count_packs(monkeypatch, module) -> list[int]:
    """How many layers each `prepacked_linears` call in `module` (a worker module that
    imported it) packed, in call order."""
    from contextlib import contextmanager

    from hybridflow.workers.rollout import prepacked
    counts = []

    @contextmanager
    def counted(model, enabled=True):
        with prepacked.prepacked_linears(model, enabled) as count:
            counts.append(count)
            yield count
    monkeypatch.setattr(module, "prepacked_linears", counted)
    return counts


def left_packed(model) -> bool:
    return any("forward" in vars(m) for m in model.modules() if isinstance(m, torch.nn.Linear))


def _mlp(dtype=torch.float32) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.GELU(),
                               torch.nn.Linear(96, 32, bias=False)).to(dtype)


def test_packed_layers_compute_what_f_linear_does_and_leave_nothing_behind():
    model, x = _mlp(), torch.randn(3, 7, 64)
    with torch.no_grad():
        want = model(x)
        with prepacked_linears(model) as packed:
            got = model(x)
            assert packed == 2 and all("forward" in vars(m) for m in model
                                       if isinstance(m, torch.nn.Linear))
        again = model(x)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(again, want)  # the class's forward is back
    assert not any("forward" in vars(m) for m in model)


def test_a_weight_update_after_the_pass_is_seen_and_grad_is_refused():
    model, x = _mlp(), torch.randn(5, 64)
    with prepacked_linears(model):
        with pytest.raises(RuntimeError, match="no backward"):
            model(x.requires_grad_())
    with torch.no_grad():
        model[0].weight.add_(1.0)  # new weights: the next pass packs them afresh
        want = model(x)
        with prepacked_linears(model):
            assert torch.allclose(model(x), want, rtol=1e-5, atol=1e-4)


def test_disabled_and_non_fp32_layers_are_left_alone():
    model = _mlp()
    with prepacked_linears(model, enabled=False) as packed:
        assert packed == 0
    bf16 = _mlp(torch.bfloat16)
    with prepacked_linears(bf16) as packed:
        assert packed == 0  # bf16 already runs through oneDNN


def test_the_hf_engine_generates_the_same_greedy_tokens_prepacked(monkeypatch):
    """The toy model's greedy rollouts and their log-probs, with and without
    `rollout.prepacked_linear`, on the same prompts; every linear layer was packed."""
    from hybridflow.workers import ActorWorker
    from hybridflow.workers.rollout import hf
    packed_counts = count_packs(monkeypatch, hf)
    from tests.support.workers import make_cfg, prompt_batch
    plain_worker = ActorWorker(make_cfg(rollout={"max_new_tokens": 6}))
    packed_worker = ActorWorker(make_cfg(rollout={"max_new_tokens": 6,
                                                  "prepacked_linear": True}))
    prompts = prompt_batch(plain_worker.tokenizer, ["1+2=", "3+4=", "12+30="])
    plain = plain_worker.generate(prompts, n=1, do_sample=False)
    packed = packed_worker.generate(prompts, n=1, do_sample=False)
    linears = sum(isinstance(m, torch.nn.Linear) for m in packed_worker.module.modules())
    assert packed_counts == [0, linears] and linears > 0
    assert torch.equal(packed["responses"], plain["responses"])
    assert torch.allclose(packed["rollout_log_probs"], plain["rollout_log_probs"], atol=1e-4)


def test_the_reference_scores_as_it_does_unpacked_with_ref_prepacked_linear(monkeypatch):
    """`ref.prepacked_linear`: the reference's log-probs of one rollout with and without
    the packed kernel, every linear layer of its own model packed for the call (and
    none left packed after it)."""
    from hybridflow.workers import ActorWorker, ReferenceWorker
    from hybridflow.workers import reference
    from tests.support.workers import make_cfg, prompt_batch
    counts = count_packs(monkeypatch, reference)
    actor = ActorWorker(make_cfg())
    rollout = actor.generate(prompt_batch(actor.tokenizer, ["1+2=", "3+4=", "12+30="]), n=2)
    plain = ReferenceWorker(make_cfg()).logprob(rollout)["ref_log_prob"]
    packed_ref = ReferenceWorker(make_cfg(ref={"prepacked_linear": True}))
    packed = packed_ref.logprob(rollout)["ref_log_prob"]
    linears = sum(isinstance(m, torch.nn.Linear) for m in packed_ref.module.modules())
    assert counts == [0, linears] and linears > 0
    assert not left_packed(packed_ref.module)
    assert torch.allclose(packed, plain, atol=1e-5), (packed - plain).abs().max()


def test_the_actor_s_old_log_probs_are_as_unpacked_with_actor_prepacked_linear(
        monkeypatch):
    """`actor.prepacked_linear`: the actor's `logprob` pass (no grad) with the current
    weights packed for the call equals the unpacked pass, every linear layer packed;
    the update is unaffected (its forward has a backward: the packed kernel would
    refuse)."""
    from hybridflow.workers import ActorWorker, actor
    from tests.support.workers import make_cfg, prompt_batch
    counts = count_packs(monkeypatch, actor)
    plain_actor = ActorWorker(make_cfg())
    packed_actor = ActorWorker(make_cfg(actor={"prepacked_linear": True}))
    rollout = plain_actor.generate(prompt_batch(plain_actor.tokenizer, ["1+2=", "12+30="]),
                                   n=2)
    plain = plain_actor.logprob(rollout)["old_log_probs"]
    packed = packed_actor.logprob(rollout)["old_log_probs"]
    linears = sum(isinstance(m, torch.nn.Linear) for m in packed_actor.module.modules())
    assert counts == [0, linears] and linears > 0
    assert torch.allclose(packed, plain, atol=1e-5), (packed - plain).abs().max()
    assert not left_packed(packed_actor.module)
    packed_actor.update(rollout.union(Batch({"old_log_probs": packed,
                                             "advantages": torch.ones_like(packed)})))
