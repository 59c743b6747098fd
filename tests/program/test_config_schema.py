"""Every config value is checked before launch, naming its key: the graph-declared
`algorithm` schema of each shipped graph (graphs/*.py `ALGORITHM`), and the range of
every field of the run's sections (hybridflow/core/constraints.py rules)."""
from __future__ import annotations

import dataclasses
import os
import textwrap

import pytest

from hybridflow.program.config import ConfigError, RunConfig, build_config
from hybridflow.core.constraints import checked, in_range
from hybridflow.program.assemble import GraphFileError, load_graph_module, prepare

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GRAPHS = ["grpo", "ppo", "rloo", "reinforce_pp", "remax", "dapo", "sft"]


def graph_path(name: str) -> str:
    return os.path.join(REPO, "graphs", f"{name}.py")


def algorithm_fields(name: str) -> dict:
    schema = load_graph_module(graph_path(name)).ALGORITHM
    return {f.name: f for f in dataclasses.fields(schema)}


# ------------------------------------------------- the graphs' algorithm section
@pytest.mark.parametrize("name", GRAPHS)
def test_every_shipped_graph_declares_its_algorithm_schema(name):
    module = load_graph_module(graph_path(name))
    assert dataclasses.is_dataclass(module.ALGORITHM)
    loaded = prepare(graph_path(name), preflight=False)
    defaults = {f: getattr(module.ALGORITHM(), f) for f in algorithm_fields(name)}
    assert dict(loaded.cfg.algorithm) == defaults  # the schema's defaults reach build(cfg)


@pytest.mark.parametrize("name", [g for g in GRAPHS if algorithm_fields(g)])
def test_a_misspelt_algorithm_key_is_refused_with_the_closest_key(name):
    key = next(iter(algorithm_fields(name)))
    typo = key[:-1] + key[-1] * 2  # e.g. norm_by_stdd
    with pytest.raises(ConfigError, match=rf"unknown config key 'algorithm\.{typo}'; "
                                          rf"did you mean 'algorithm\.{key}'"):
        prepare(graph_path(name), [f"algorithm.{typo}=1"], preflight=False)


@pytest.mark.parametrize("name", [g for g in GRAPHS if not algorithm_fields(g)])
def test_a_graph_without_knobs_refuses_any_algorithm_key(name):
    with pytest.raises(ConfigError, match=r"unknown config key 'algorithm\.gamma'"):
        prepare(graph_path(name), ["algorithm.gamma=0.9"], preflight=False)


def test_the_issue_example_is_refused_before_launch():
    with pytest.raises(ConfigError, match=r"'algorithm\.norm_by_sdt'; did you mean "
                                          r"'algorithm\.norm_by_std'"):
        prepare(graph_path("grpo"), ["algorithm.norm_by_sdt=false"], preflight=False)


@pytest.mark.parametrize("name, override, key", [
    ("grpo", "algorithm.norm_by_std=maybe", "algorithm.norm_by_std"),
    ("ppo", "algorithm.gamma=high", "algorithm.gamma"),
    ("reinforce_pp", "algorithm.baseline=sometimes", "algorithm.baseline"),
    ("dapo", "algorithm.max_rounds=1.5", "algorithm.max_rounds"),
    ("sft", "algorithm.stop_fraction=most", "algorithm.stop_fraction"),
])
def test_a_wrong_type_in_the_algorithm_section_names_the_key(name, override, key):
    with pytest.raises(ConfigError, match=rf"bad value for '{key}'"):
        prepare(graph_path(name), [override], preflight=False)


@pytest.mark.parametrize("name, override, words", [
    ("ppo", "algorithm.gamma=1.5", "algorithm.gamma must be in [0, 1], got 1.5"),
    ("ppo", "algorithm.lam=-0.1", "algorithm.lam must be in [0, 1], got -0.1"),
    ("ppo", "algorithm.kl_coef=-1", "algorithm.kl_coef must not be negative, got -1.0"),
    ("ppo", "algorithm.kl_target=0", "algorithm.kl_target must be greater than 0, got 0.0"),
    ("ppo", "algorithm.kl_kind=k9", "algorithm.kl_kind='k9' is not a known KL kind"),
    ("reinforce_pp", "algorithm.kl_kind=k22", "algorithm.kl_kind='k22' is not a known KL"),
    ("dapo", "algorithm.max_rounds=-1", "algorithm.max_rounds must not be negative, got -1"),
    ("dapo", "algorithm.overlong_factor=nan", "algorithm.overlong_factor must be a finite"),
    ("sft", "algorithm.stop_fraction=2", "algorithm.stop_fraction must be in [0, 1], got 2.0"),
])
def test_algorithm_values_out_of_range_name_the_key(name, override, words):
    with pytest.raises(ConfigError) as info:
        prepare(graph_path(name), [override], preflight=False)
    assert words in str(info.value)


def test_a_user_graph_without_a_schema_keeps_a_free_form_algorithm(tmp_path):
    path = tmp_path / "free.py"
    path.write_text(textwrap.dedent("""\
        from hybridflow import Graph

        def defaults():
            return {"algorithm": {"gamma": 0.9}}

        def build(cfg):
            g = Graph("free")
            g.call("reward.score", g.call("actor.generate", g.source("prompts")))
            return g
    """))
    loaded = prepare(str(path), ["algorithm.anything=3"], preflight=False)
    assert loaded.cfg.algorithm == {"gamma": 0.9, "anything": 3}


def test_a_declared_schema_may_use_the_range_rules(tmp_path):
    path = tmp_path / "own.py"
    path.write_text(textwrap.dedent("""\
        from dataclasses import dataclass
        from hybridflow import Graph
        from hybridflow.core.constraints import checked, in_range

        @dataclass
        class Options:
            beta: float = checked(0.1, in_range(0, 1))

        ALGORITHM = Options

        def build(cfg):
            g = Graph("own")
            g.call("reward.score", g.call("actor.generate", g.source("prompts")))
            return g
    """))
    assert prepare(str(path), preflight=False).cfg.algorithm.beta == 0.1
    with pytest.raises(ConfigError, match=r"algorithm\.beta must be in \[0, 1\], got 3\.0"):
        prepare(str(path), ["algorithm.beta=3"], preflight=False)


def test_an_algorithm_that_is_not_a_dataclass_is_refused(tmp_path):
    path = tmp_path / "bad.py"
    path.write_text("from hybridflow import Graph\nALGORITHM = {'gamma': 1.0}\n"
                    "def build(cfg):\n    return Graph('bad')\n")
    with pytest.raises(GraphFileError, match="ALGORITHM in .* must be a dataclass"):
        prepare(str(path), preflight=False)


# ------------------------------------------------- every field of the run's sections
@pytest.mark.parametrize("override, words", [
    ("actor.lr=nan", "actor.lr must be a finite number, got nan"),
    ("critic.lr=inf", "critic.lr must be a finite number, got inf"),
    ("actor.lr=-1", "actor.lr must not be negative, got -1.0"),
    ("actor.weight_decay=-0.1", "actor.weight_decay must not be negative"),
    ("actor.betas=[0.9,1.5]", "actor.betas must be two numbers in [0, 1), got [0.9, 1.5]"),
    ("actor.grad_clip=0", "actor.grad_clip must be greater than 0, got 0.0"),
    ("actor.clip_c=1", "actor.clip_c must be greater than 1, got 1.0"),
    ("actor.min_lr_ratio=2", "actor.min_lr_ratio must be in [0, 1], got 2.0"),
    ("actor.total_steps=0", "actor.total_steps must be at least 1, got 0"),
    ("actor.warmup_steps=-2", "actor.warmup_steps must not be negative, got -2"),
    ("actor.lora.rank=-1", "actor.lora.rank must not be negative, got -1"),
    ("actor.lora.dropout=1", "actor.lora.dropout must be in [0, 1), got 1.0"),
    ("critic.micro_batch_size=0", "critic.micro_batch_size must be at least 1, got 0"),
    ("critic.cliprange_value=-1", "critic.cliprange_value must not be negative"),
    ("trainer.seed=-1", "trainer.seed must not be negative, got -1"),
    ("trainer.steps=0", "trainer.steps must be at least 1, got 0"),
    ("trainer.save_every=-1", "trainer.save_every must not be negative, got -1"),
    ("trainer.max_checkpoints=-1", "trainer.max_checkpoints must not be negative, got -1"),
    ("trainer.val_every=-5", "trainer.val_every must not be negative, got -5"),
    ("trainer.val_samples=0", "trainer.val_samples must be in [1, 1024], got 0"),
    ("trainer.run_name=../../x", "trainer.run_name must be a plain name"),
    ("trainer.run_name=a/b", "trainer.run_name must be a plain name"),
    ("trainer.run_name=..", "trainer.run_name must be a plain name"),
    ("data.batch_size=0", "data.batch_size must be at least 1, got 0"),
    ("data.max_prompt_length=-3", "data.max_prompt_length must be at least 1, got -3"),
    ("data.toy.max_operand=0", "data.toy.max_operand must be at least 1, got 0"),
    ("data.toy.test_fraction=0", "data.toy.test_fraction must be in (0, 1), got 0.0"),
    ("data.toy.test_fraction=1", "data.toy.test_fraction must be in (0, 1), got 1.0"),
    ("rollout.temperature=0", "rollout.temperature must be greater than 0, got 0.0"),
    ("rollout.temperature=-1", "rollout.temperature must be greater than 0, got -1.0"),
    ("rollout.top_p=0", "rollout.top_p must be in (0, 1], got 0.0"),
    ("rollout.top_p=1.5", "rollout.top_p must be in (0, 1], got 1.5"),
    ("rollout.top_k=-2", "rollout.top_k must be at least -1, got -2"),
    ("rollout.n=0", "rollout.n must be at least 1, got 0"),
    ("rollout.max_new_tokens=0", "rollout.max_new_tokens must be at least 1, got 0"),
    ("rollout.micro_batch_size=0", "rollout.micro_batch_size must be at least 1, got 0"),
    ("rollout.gpu_memory_utilization=1.2", "rollout.gpu_memory_utilization must be in (0, 1]"),
    ("ref.micro_batch_size=0", "ref.micro_batch_size must be at least 1, got 0"),
    ("reward.num_workers=-1", "reward.num_workers must not be negative, got -1"),
    ("reward.timeout_s=0", "reward.timeout_s must be greater than 0, got 0.0"),
    ("runtime.call_timeout_s=-5", "runtime.call_timeout_s must be greater than 0, got -5.0"),
    ("runtime.start_timeout_s=0", "runtime.start_timeout_s must be greater than 0, got 0.0"),
    ("runtime.torch_threads=0", "runtime.torch_threads must be at least 1, got 0"),
    ("runtime.num_cpus=0", "runtime.num_cpus must be at least 1, got 0"),
    ("runtime.num_gpus=-1", "runtime.num_gpus must not be negative, got -1"),
    ("runtime.name=slurm", "runtime.name must be 'local' or 'ray', got 'slurm'"),
    ("model.device=tpu", "model.device must be 'auto', 'cpu', 'cuda' or 'cuda:<index>'"),
    ("placement.cluster.nodes=0", "placement.cluster.nodes must be at least 1, got 0"),
    ("actor.strategy=zero3", "actor.strategy='zero3' is not a known training strategy"),
    ("critic.lr_schedule=linear", "critic.lr_schedule='linear' is not a known lr schedule"),
    ("rollout.backend=sglang", "rollout.backend='sglang' is not a known rollout backend"),
])
def test_a_value_out_of_range_is_refused_naming_key_value_and_range(override, words):
    with pytest.raises(ConfigError) as info:
        build_config(overrides=[override])
    assert words in str(info.value)


@pytest.mark.parametrize("override", [
    "trainer.run_name=my-run_2", "rollout.top_k=-1", "rollout.top_k=50", "model.device=cuda:1",
    "trainer.max_checkpoints=0", "actor.lr=0", "runtime.num_gpus=0", "rollout.top_p=1",
])
def test_values_at_the_edge_of_their_range_are_accepted(override):
    build_config(overrides=[override])


def test_the_checks_cover_every_section_that_is_not_free_form():
    """Each numeric or named field of the run's schema declares a rule, or is a
    deliberately free value (listed here): a new field must choose."""
    free = {"entropy_coeff", "function_name", "runs_dir", "tokenizer", "dtype", "device"}

    def fields_without_rule(cls, prefix=""):
        for f in dataclasses.fields(cls):
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING \
                else f.default
            if dataclasses.is_dataclass(default):
                yield from fields_without_rule(type(default), f"{prefix}{f.name}.")
            elif f.type in ("int", "float", "str", "Optional[int]", "Optional[float]",
                            "int | None", "float | None", "str") and \
                    "rule" not in f.metadata and f.name not in free:
                yield prefix + f.name

    assert list(fields_without_rule(RunConfig)) == []


def test_checked_builds_a_dataclass_field_with_its_rule():
    rule = in_range(0, 1)
    field = checked(0.5, rule)
    assert field.default == 0.5 and field.metadata["rule"] is rule


def test_a_graph_reusing_a_shipped_build_gets_its_schema(tmp_path):
    path = tmp_path / "mine.py"
    path.write_text("from graphs.grpo import build, defaults\n")
    loaded = prepare(str(path), ["algorithm.norm_by_std=false"], preflight=False)
    assert loaded.cfg.algorithm.norm_by_std is False
    with pytest.raises(ConfigError, match=r"did you mean 'algorithm\.norm_by_std'"):
        prepare(str(path), ["algorithm.norm_by_sdt=false"], preflight=False)


@pytest.mark.parametrize("override, words", [
    ("placement.pools.main.devices_per_node=-1",
     "placement.pools.main.devices_per_node must be at least 1, got -1"),
    ("placement.pools.rm.nodes=0", "placement.pools.rm.nodes must be at least 1, got 0"),
    ("placement.parallel.actor.tp=0", "placement.parallel.actor.tp must be at least 1, got 0"),
    ("placement.parallel.critic.dp=-2", "placement.parallel.critic.dp must be at least 1"),
])
def test_pools_and_parallel_layouts_are_checked(override, words):
    with pytest.raises(ConfigError) as info:
        build_config(overrides=[override])
    assert words in str(info.value)


def test_a_parallel_layout_may_leave_dp_unset():
    from hybridflow.graph.builder import Graph
    from hybridflow.program.assemble import placement_from_config
    cfg = build_config(overrides=["placement.pools.main.devices_per_node=2",
                                  "placement.parallel.actor.tp=2"])
    g = Graph("g")
    g.call("actor.generate", g.source())
    assert placement_from_config(cfg, g).parallel == {"actor": {"tp": 2, "sp": 1}}
