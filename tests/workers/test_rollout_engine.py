"""Rollout engines (hybridflow/workers/rollout/): the registry, a third engine added
by a test in a few lines and run in a graph, and the `hf` engine's log-probs."""
import pytest
import torch

from tests.support.workers import make_cfg, prompt_batch
from hybridflow.core.batch import Batch
from hybridflow.plan.compiler import compile_graph
from hybridflow.graph.builder import Graph
from hybridflow.plan.placement import Placement
from hybridflow.runtime.local import LocalRuntime
from hybridflow.workers import DEFAULT_ROLES, ActorWorker
from hybridflow.workers.rollout import assemble_rollout, engine_names, register_engine
from hybridflow.workers.rollout.engine import check_engine_name

PROMPTS = ["1+2=", "10+20=", "7*8="]


class CountingEngine:
    """A deterministic engine: each response repeats the prompt's last token
    `max_new_tokens` times, with log-prob -1 per token."""
    shares_module = False

    def __init__(self, spec):
        self.tokenizer, self.policy_version, self.loaded = spec.tokenizer, 0, []

    def generate(self, prompts: Batch, opts) -> Batch:
        last = prompts["input_ids"][:, -1:]
        responses = last.repeat(1, opts.max_new_tokens)
        return assemble_rollout(prompts, responses, self.tokenizer.pad_token_id, -1,
                                torch.full(responses.shape, -1.0))

    def load_weights(self, weights):
        self.loaded += [name for name, _ in weights]

    def finish_weight_update(self, version):
        self.policy_version = version

    def sleep(self):
        pass

    def wake_up(self):
        pass


@pytest.fixture(scope="module", autouse=True)
def counting_engine():
    """Registered for this module only: other tests see the built-in engines."""
    from hybridflow.workers.rollout import engine
    saved = dict(engine._ENGINES)
    register_engine("counting", CountingEngine, replace=True)
    yield
    engine._ENGINES.clear()
    engine._ENGINES.update(saved)


def test_builtin_engines_are_registered_and_unknown_names_are_refused():
    assert {"hf", "vllm", "counting"} <= set(engine_names())
    with pytest.raises(ValueError, match=r"rollout.backend='vlm' .*did you mean 'vllm'"):
        check_engine_name("vlm")
    with pytest.raises(ValueError, match="already registered"):
        register_engine("hf", CountingEngine)


def test_an_engine_named_by_import_path_is_registered_where_it_is_used():
    name = "hybridflow.workers.rollout.hf:make_hf_engine"
    check_engine_name(name)
    assert name in engine_names()
    with pytest.raises(ValueError, match="defines no 'no_such_factory'"):
        check_engine_name("hybridflow.workers.rollout.hf:no_such_factory")


def test_a_registered_engine_runs_a_graph_on_its_own_pool():
    g = Graph("counting")
    g.call("rollout.generate", g.source("prompts", keys=("input_ids", "attention_mask", "uid")),
           n=2)
    bindings = {"rollout": DEFAULT_ROLES["rollout"]}
    plan = compile_graph(g, bindings, Placement.single_pool(bindings))
    cfg = make_cfg(rollout={"backend": "counting", "max_new_tokens": 3})
    runtime = LocalRuntime(plan, cfg)
    tok = runtime.workers("rollout")[0].engine.tokenizer
    prompts = prompt_batch(tok, PROMPTS)
    out = runtime.run_step({"prompts": prompts}).outputs["rollout.generate"]
    last = prompts["input_ids"][:, -1].repeat_interleave(2)
    assert torch.equal(out["responses"], last[:, None].repeat(1, 3))
    assert out["policy_version"].tolist() == [0] * 6
    assert out["rollout_log_probs"].eq(-1).all()
    assert list(out["uid"]) == [u for u in prompts["uid"] for _ in range(2)]


def test_the_actor_generates_through_the_configured_engine():
    actor = ActorWorker(make_cfg(rollout={"backend": "counting", "max_new_tokens": 2}))
    out = actor.generate(prompt_batch(actor.tokenizer, PROMPTS))
    assert isinstance(actor.engine, CountingEngine)
    assert out["responses"][:, 0].tolist() == [int(t) for t in out["prompts"][:, -1]]
    assert actor.engine.loaded == [] and out["policy_version"].eq(0).all()  # already current
    actor.policy_version = 1  # as after an update: the engine's own copy is refreshed
    out = actor.generate(prompt_batch(actor.tokenizer, PROMPTS))
    assert "lm_head.weight" in actor.engine.loaded and out["policy_version"].eq(1).all()


def test_hf_rollout_log_probs_are_the_trainers_log_probs_of_the_sampled_tokens(actor_module):
    batch = prompt_batch(actor_module.tokenizer, PROMPTS)
    torch.manual_seed(0)
    out = actor_module.generate(batch, n=2, temperature=0.7)
    scored = actor_module.logprob(out, temperature=0.7)
    mask = out["response_mask"].bool()
    assert torch.allclose(out["rollout_log_probs"][mask], scored["old_log_probs"][mask],
                          atol=1e-4)
    assert (out["rollout_log_probs"][~mask] == 0).all()
    assert scored.meta["metrics"]["rollout/probs_diff_max"] < 1e-4


def test_hf_engine_refuses_a_weight_its_model_does_not_have(actor_module):
    with pytest.raises(KeyError, match="model.no_such.weight"):
        actor_module.engine.load_weights([("model.no_such.weight", torch.zeros(1))])
