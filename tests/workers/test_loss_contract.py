"""Issue 26 class 12, the loss API's contract, swept.

1. Every order in which a loss reads `out`'s accessors (logits, log_probs,
   entropy with and without grad) leaves the gradient of `out.log_probs` intact: a
   metric read first (`out.entropy(grad=False)`) must not strip the shared forward.
2. Every wrong kind of return value is refused with one message that names the loss
   and states the contract (a 0-dim float tensor with a gradient, a metrics dict).
"""
import itertools
import re

import pytest
import torch

from hybridflow.graph.loss import loss_fn
from hybridflow.workers import ActorWorker
from hybridflow.workers.loss_inputs import PolicyOutputs, run_loss
from tests.support.workers import make_cfg, rollout_for_update

ACCESSORS = {
    "logits": lambda out: out.logits,
    "log_probs": lambda out: out.log_probs,
    "entropy": lambda out: out.entropy(),
    "entropy_nograd": lambda out: out.entropy(grad=False),
}


@pytest.fixture(scope="module")
def actor():
    return ActorWorker(make_cfg())


@pytest.fixture(scope="module")
def data(actor):
    return rollout_for_update(actor)


def _outputs(actor, data):
    mask = data["response_mask"]
    return PolicyOutputs(actor.module, data, mask.sum().double(),
                         torch.tensor(float(mask.shape[0])))


ORDERS = [order for r in range(1, 5) for order in itertools.permutations(ACCESSORS, r)]


@pytest.mark.parametrize("order", ORDERS, ids="-".join)
def test_every_accessor_order_keeps_the_gradient(actor, data, order):
    out = _outputs(actor, data)
    read = {name: ACCESSORS[name](out) for name in order}
    assert not read.get("entropy_nograd", torch.zeros(())).requires_grad
    for name in ("logits", "log_probs", "entropy"):
        if name in read:
            assert read[name].requires_grad, f"{name} lost its gradient after {order}"
    # whatever was read before, log_probs read now still carries the gradient
    loss = -out.mean(out.log_probs)
    loss.backward()
    grads = [p.grad for p in actor.module.parameters() if p.grad is not None]
    assert grads and any(float(g.abs().sum()) > 0 for g in grads)
    actor.module.zero_grad(set_to_none=True)


def test_entropy_without_grad_first_then_update_trains(actor, data):
    """The trap through the worker: the metric first, the policy loss after."""
    @loss_fn(reads=("advantages",))
    def metric_first(micro, out):
        ent = out.entropy(grad=False)
        loss = -out.mean(out.log_probs * micro["advantages"])
        return loss, {"ent": out.mean(ent)}

    before = [p.detach().clone() for p in actor.module.parameters()]
    metrics = actor.update(data, loss=metric_first).meta["metrics"]
    moved = sum(float((p.detach() - b).abs().sum())
                for p, b in zip(actor.module.parameters(), before))
    assert moved > 0 and "actor/ent" in metrics


def _scalar(out):
    return -out.mean(out.log_probs)


WRONG = {
    "bare_tensor": (lambda micro, out: _scalar(out), "not a \\(loss, metrics\\) pair"),
    "float": (lambda micro, out: (float(_scalar(out)), {}), "type float, not a tensor"),
    "none": (lambda micro, out: None, "type NoneType"),
    "list_pair": (lambda micro, out: [_scalar(out), {}], "type list"),
    "triple": (lambda micro, out: (_scalar(out), {}, {}), "a tuple of 3"),
    "non_scalar": (lambda micro, out: (out.log_probs, {}), "not a scalar"),
    "one_elem": (lambda micro, out: (_scalar(out).reshape(1), {}), "shape \\[1\\]"),
    "int_tensor": (lambda micro, out: (torch.tensor(3), {}), "dtype torch.int64"),
    "detached": (lambda micro, out: (_scalar(out).detach(), {}), "no gradient"),
    "constant": (lambda micro, out: (torch.tensor(0.5), {}), "no gradient"),
    "no_grad_ctx": (lambda micro, out: _under_no_grad(out), "no gradient"),
    "metrics_list": (lambda micro, out: (_scalar(out), [1.0]), "metrics of type list"),
    "metrics_none": (lambda micro, out: (_scalar(out), None), "metrics of type NoneType"),
}


def _under_no_grad(out):
    with torch.no_grad():
        return out.mean(out.entropy(grad=False)), {}


@pytest.mark.parametrize("case", sorted(WRONG))
def test_every_wrong_return_states_the_contract(actor, data, case):
    body, why = WRONG[case]
    body.__name__ = case
    with pytest.raises(TypeError) as err:
        run_loss(body, data, _outputs(actor, data))
    text = str(err.value)
    assert f"loss {case!r} must return (loss, metrics)" in text
    assert "0-dim float tensor" in text and "gradient" in text and "metrics a dict" in text
    assert re.search(why, text), text
    actor.module.zero_grad(set_to_none=True)


def test_a_wrong_return_is_refused_through_update(actor, data):
    @loss_fn()
    def returns_float(micro, out):
        return float(_scalar(out)), {}

    with pytest.raises(TypeError, match="'returns_float' must return .* 0-dim float tensor"):
        actor.update(data, loss=returns_float)


def test_a_right_loss_passes(actor, data):
    loss, metrics = run_loss(lambda micro, out: (_scalar(out), {"m": 1.0}), data,
                             _outputs(actor, data))
    assert loss.dim() == 0 and loss.requires_grad and metrics == {"m": 1.0}
