"""Compose and validate run configs exactly as adpsgd-run does (the commands share this).

Hydra composes ``conf/`` over schemas that :func:`register_schemas` puts in its ConfigStore:
the top level (runner/config/run_schema.py) and every registered algorithm, recipe, topology and
launcher (their ``Config`` dataclasses), under ``schema/<group>/<name>``; every YAML of conf/
extends its schema and holds only what differs from it. :func:`validate` then merges each section
into its schema once more (a typo or a wrong type is one line naming the key, whatever produced it)
and runs each schema's ``check`` and the algorithm's ``check_world``. This module is where
configuration meets the registries: the schemas themselves import none of them.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import hashlib
import importlib.resources
import importlib.util
import re
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

from ..algos import ALGORITHMS
from ..config.cluster import ClusterConfig
from ..config.registry import Registry
from ..config.run_schema import FIXED_SECTIONS, RunConfig
from ..errors import ConfigError, UserError, one_line
from ..launch import LAUNCHERS
from ..recipe import RECIPES
from ..topology import TOPOLOGIES

CONFIG_MODULE = "runner.conf"
CONFIG_NAME = "config"
# conf/launcher/slurm.yaml derives the number of ranks: nprocs = ${multiply:nodes,procs_per_node}
# (0 when a factor is null: the launcher's check then names the missing key).
if not OmegaConf.has_resolver("multiply"):
    OmegaConf.register_new_resolver(
        "multiply", lambda a, b: 0 if a is None or b is None else int(a) * int(b))


def user_config_groups() -> str:
    """The groups a user chooses from, one line each (``--help``): conf/'s folders. Hydra's own
    list would show the ``schema/`` groups behind them too, which are no choice."""
    root = importlib.resources.files(CONFIG_MODULE)
    lines = []
    for group in sorted(entry.name for entry in root.iterdir()
                        if entry.is_dir() and not entry.name.startswith("_")):
        options = sorted(f.name.removesuffix(".yaml") for f in root.joinpath(group).iterdir()
                         if f.name.endswith(".yaml"))
        lines.append(f"{group}: {', '.join(options)}")
    return "\n".join(lines)


if not OmegaConf.has_resolver("adpsgd_config_groups"):  # conf/config.yaml's help template
    OmegaConf.register_new_resolver("adpsgd_config_groups", user_config_groups)


# A sweep job's dir name: short enough for any file system (255 bytes a name), one level deep.
SWEEP_NAME_MAX = 120
# Override syntax that says nothing about the value ([3,5] -> 3,5; 'a b' -> a_b).
_SWEEP_NAME_DROP = re.compile(r"[\[\]{}()'\"]")
_SWEEP_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9._=,+~@%-]")


def sweep_subdir(num: int, swept: str, fallback: str) -> str:
    """``NUM-SWEPT`` (e.g. ``1-topology=random_ring``), the dir of sweep job ``num`` under
    hydra.sweep.dir. ``swept`` is ``hydra.job.override_dirname``, the job's values of the keys
    the command line sweeps (adpsgd-run excludes the others); without any (``-m`` over one
    value) the name is ``NUM-FALLBACK``. A slash would nest dirs and a space or a quote makes
    the name awkward in a shell: they become ``_``; past SWEEP_NAME_MAX characters the name is
    cut and ends with a hash of the whole, so that names stay distinct and readable."""
    name = _SWEEP_NAME_UNSAFE.sub("_", _SWEEP_NAME_DROP.sub("", str(swept))) or str(fallback)
    name = f"{num}-{name}"
    if len(name) > SWEEP_NAME_MAX:
        digest = hashlib.sha1(name.encode()).hexdigest()[:8]
        name = f"{name[:SWEEP_NAME_MAX - 9]}-{digest}"
    return name


if not OmegaConf.has_resolver("adpsgd_sweep_subdir"):  # conf/config.yaml's hydra.sweep.subdir
    OmegaConf.register_new_resolver("adpsgd_sweep_subdir", sweep_subdir)


def registries() -> dict[str, Registry]:
    """Config group -> the registry of its choices."""
    return {"recipe": RECIPES, "algo": ALGORITHMS, "topology": TOPOLOGIES,
            "launcher": LAUNCHERS}


# What register_schemas() last put in the ConfigStore: each group's choices and their schemas.
_registered: tuple | None = None


def register_schemas() -> None:
    """Put every schema in Hydra's ConfigStore (idempotent): ``schema/run`` for the top level
    and ``schema/<group>/<name>`` for each registered choice. Storing them costs a third of a
    composition (each dataclass becomes a config): done again only where a registry changed
    or the store lost them."""
    global _registered
    store = ConfigStore.instance()
    registered = tuple((group, name, registry.get(name).Config)
                       for group, registry in registries().items() for name in registry.names())
    if registered == _registered and "run.yaml" in store.repo.get("schema", {}):
        return
    store.store(group="schema", name="run", node=RunConfig)
    store.store(group="schema", name="cluster", node=ClusterConfig)  # conf/cluster/ extends it
    for group, registry in registries().items():
        for name in registry.names():  # a schema may serve several names (the speech recipes)
            store.store(group=f"schema/{group}", name=name,
                        node=OmegaConf.structured(registry.get(name).Config(name=name)))
    _registered = registered


def _dotted_keys(node, prefix: str = "") -> list[str]:
    keys = []
    for key, value in node.items():
        dotted = f"{prefix}{key}"
        keys.append(dotted)
        if isinstance(value, DictConfig):
            keys.extend(_dotted_keys(value, dotted + "."))
    return keys


def config_dirs(overrides: list[str]) -> list[Path]:
    """Where Hydra looks for config files: ``hydra.searchpath``'s directories (a ``-cd DIR``
    is one, runner/commands/run.py), then the package's conf/."""
    dirs = [Path(found) for o in overrides if o.startswith("hydra.searchpath=")
            for found in re.findall(r"file://([^,\]\s'\"]+)", o)]
    package = importlib.util.find_spec(CONFIG_MODULE)
    return dirs + [Path(p) for p in (package.submodule_search_locations or [])]


def check_override_spacing(overrides: list[str]) -> None:
    """A space around ``=`` (``trainer.epochs= 3``, ``trainer.epochs =3``) splits one override
    into two words, which Hydra reports as a lexer exception: name the key and the space."""
    for word, after in zip(overrides, [*overrides[1:], ""]):
        if word.endswith("=") and after and "=" not in after:  # KEY= VALUE
            key, value = word[:-1], after
        elif "=" not in word and after.startswith("="):  # KEY =VALUE
            key, value = word, after[1:]
        else:
            continue
        raise UserError(f"{key}: a space around '=' made {word} {after} two words of the "
                        "command line", f"write {key}={value}, without spaces")


def hydra_error(ex: Exception, base: DictConfig | None,
                searchpath: list[Path] | None = None) -> UserError:
    """Turn Hydra's multi-line composition errors into one actionable line (``searchpath``:
    where the config files are, to name the file a mistyped key is in)."""
    text = str(ex)
    in_file = re.search(r"In '([^']+)': ConfigKeyError raised while composing config:\s*"
                        r"Key '([^']+)' not in '\w+'\s*full_key: (\S+)", text)
    if in_file:  # a mistyped key in a config file (one of conf/cluster/, say)
        source, leaf, full = in_file.groups()
        path = next((d / f"{source}.yaml" for d in searchpath or []
                     if (d / f"{source}.yaml").is_file()), Path(f"{source}.yaml"))
        parent = full.rpartition(".")[0]
        section = OmegaConf.select(base, parent) if base is not None and parent else None
        siblings = [str(k) for k in section.keys()] if isinstance(section, DictConfig) else []
        close = difflib.get_close_matches(leaf, siblings, n=1)
        fix = (f"did you mean {close[0]}? (in {path})" if close else
               f"the keys of {parent} are {', '.join(siblings)}" if siblings else
               f"correct it in {path}")
        return UserError(f"unknown key {leaf!r} in {path} ({full})", fix)
    missing = re.search(r"Could not find '([^/']+)/([^']+)'", text)
    if missing:
        group, option = missing.groups()
        options = re.findall(r"^\t(\S+)$", text, flags=re.M)
        if not options:
            return UserError(f"unknown {group} {option!r}", f"add conf/{group}/{option}.yaml")
        # Suggest the closest spelling, else the group's default.
        default = base.get(group, {}).get("name") if base is not None else None
        suggestion = (difflib.get_close_matches(option, options, n=1)
                      or [default if default in options else options[0]])[0]
        return UserError(f"unknown {group} {option!r} (available: {', '.join(options)})",
                         f"{group}={suggestion}")
    override = re.search(r"Could not override '([^']+)'", text)
    if override:
        key = override.group(1)
        known = _dotted_keys(base) if base is not None else []
        # Suggest from the key's own section first, comparing the last names (algo.period is
        # no misspelt algo.name: their shared "algo." would make them look alike).
        parent, _, leaf = key.rpartition(".")
        siblings = [k.rpartition(".")[2] for k in known if k.rpartition(".")[0] == parent]
        close = ([f"{parent}.{c}" if parent else c
                  for c in difflib.get_close_matches(leaf, siblings, n=1)] if siblings
                 else difflib.get_close_matches(key, known, n=1))
        if close:
            fix = f"did you mean {close[0]}?"
        elif siblings:
            fix = f"the keys of {parent or 'the config'} are {', '.join(siblings)}"
        else:
            fix = f"check the spelling, or add it with +{key}=VALUE"
        return UserError(f"unknown key {key!r}", fix)
    merging = re.search(r"Error merging override ([^=\s]+)=(\S*)", text)
    section = OmegaConf.select(base, merging.group(1)) if merging and base is not None else None
    if isinstance(section, DictConfig):  # optim=adam, faults=[1]: a value for a section
        return section_given_a_value(merging.group(1), leaf_keys(section), merging.group(2))
    cause = ex.__cause__
    if merging and isinstance(cause, ValidationError):  # a value of the wrong type
        key = merging.group(1)
        return type_error(key, cause, _declared_type(key, base))
    return UserError(one_line(text).replace(
        "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.", "").strip()
        or type(ex).__name__, "check the command line")


def sweep_jobs(overrides: list[str], multirun: bool) -> list[list[str]]:
    """The overrides of every job of the command line (every sweep combination with -m)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception as ex:  # noqa: BLE001 - Hydra raises several parse error types
        raise hydra_error(ex, None) from None
    return [list(job) for job in BasicSweeper.split_arguments(parsed, None)[0]] if multirun \
        else [list(overrides)]


def compose_all(overrides: list[str], multirun: bool, config_name: str,
                with_hydra: bool = False) -> list[DictConfig]:
    """Compose every job of the command line (every sweep combination with -m).
    ``with_hydra``: keep Hydra's own node (``hydra.run.dir``...), which :func:`job_config`
    removes again."""
    from hydra import compose, initialize_config_module

    RECIPES.require_entries()
    register_schemas()  # idempotent: the recipes may have registered after conf/ was loaded
    jobs = sweep_jobs(overrides, multirun)
    configs = []
    with initialize_config_module(config_module=CONFIG_MODULE, version_base=None):
        for job in jobs:
            try:
                configs.append(compose(config_name=config_name, overrides=list(job),
                                       return_hydra_config=with_hydra))
            except Exception as ex:  # noqa: BLE001
                raise hydra_error(ex, _chosen_groups(compose, config_name, job),
                                  config_dirs(list(job))) from None
    return configs


def job_config(cfg: DictConfig) -> DictConfig:
    """The job's own config out of one composed with Hydra's node."""
    return OmegaConf.masked_copy(cfg, [key for key in cfg if key != "hydra"])


def _chosen_groups(compose, config_name: str, overrides) -> DictConfig:
    """The config with only the command line's group choices (``recipe=imagenet``...): the
    keys a mistyped key is compared with, so that suggestions come from the chosen recipe.
    Only read. The package's conf/ does not change while a process runs, so the same
    choices over the same schemas give the same config: composed once (a process that checks
    many command lines, as the tests do, paid a second composition for each mistake); not
    where ``hydra.searchpath`` adds a user's directory, whose files may change meanwhile."""
    choices = tuple(str(o) for o in overrides
                    if "=" in str(o) and not str(o).startswith(("+", "~"))
                    and "." not in str(o).split("=", 1)[0])
    if any(str(o).startswith("hydra.searchpath=") for o in overrides):
        return _compose_choices.__wrapped__(compose, config_name, choices, _registered)
    return _compose_choices(compose, config_name, choices, _registered)


@functools.lru_cache(maxsize=64)
def _compose_choices(compose, config_name: str, choices: tuple[str, ...],
                     schemas: tuple | None) -> DictConfig:
    """``schemas``: what register_schemas() stored (part of the cache's key only)."""
    try:
        return compose(config_name=config_name, overrides=list(choices))
    except Exception:  # noqa: BLE001 - a bad group choice: fall back to the defaults
        return compose(config_name=config_name)


def _declared_type(key: str, base: DictConfig | None) -> str | None:
    """The annotation of ``key`` in the schema that holds it (its section's dataclass, or the
    chosen algorithm's, recipe's... for a group), e.g. ``int``."""
    section, _, rest = key.partition(".")
    if not rest:  # a top-level value (seed); the sections have a default_factory
        top = {f.name: f for f in dataclasses.fields(RunConfig)}.get(section)
        plain = top is not None and top.default_factory is dataclasses.MISSING
        return str(top.type) if plain else None
    schema = FIXED_SECTIONS.get(section)
    if schema is None and section in registries() and base is not None:
        name = OmegaConf.select(base, f"{section}.name")
        schema = registries()[section].get(name).Config if name in registries()[section] else None
    for part in rest.split(".") if schema is not None else []:
        found = {f.name: f for f in dataclasses.fields(schema)}.get(part)
        if found is None:
            return None
        if not dataclasses.is_dataclass(found.default_factory if found.default_factory
                                        is not dataclasses.MISSING else None):
            return str(found.type)
        schema = found.default_factory
    return None


def type_error(key: str, ex: ValidationError, declared: str | None) -> ConfigError:
    """One line for a value of the wrong type: OmegaConf's problem, the declared type."""
    problem = one_line(ex.msg).split(" full_key:")[0]
    choices = {"bool": "true or false", "Optional[bool]": "true, false or null (null: decided "
               "for the run, see the key's comment)"}.get(str(declared))
    if choices:
        fix = f"set {key} to {choices}"
    else:
        fix = f"{key}=<{declared}>" if declared else f"give {key} a value of the right type"
    return ConfigError(key, problem, fix)


def _resume_keys(plain: dict[str, Any]) -> dict[str, Any]:
    """The top-level ``resume`` (null, auto or a checkpoint dir) and ``resume_averaged``."""
    resume = plain.pop("resume", None)
    if resume is not None and (not isinstance(resume, str) or not resume.strip()):
        raise ConfigError("resume", f"must be null, auto or the path of a checkpoint dir, got "
                          f"{resume!r}", "resume=auto")
    averaged = plain.pop("resume_averaged", False)
    if not isinstance(averaged, bool):
        raise ConfigError("resume_averaged", f"must be true or false, got {averaged!r}",
                          "resume_averaged=true")
    return {"resume": resume, "resume_averaged": averaged}


def _known_keys(schema: type) -> list[str]:
    return [f.name for f in dataclasses.fields(schema)]


def leaf_keys(section: DictConfig) -> list[str]:
    """The keys of ``section`` that hold values, not sub-sections (what an example can set)."""
    return [str(k) for k, v in section.items() if not isinstance(v, DictConfig)]


def section_given_a_value(prefix: str, keys: list[str], value: Any = None) -> ConfigError:
    """The error for a whole section set to one value (``optim=adam``: optim is a section of
    keys, not a config group to choose from); ``keys`` are its own keys, for the example."""
    got = "" if value is None else f" (got {value!r})"
    example = f"{prefix}.{keys[0]}=..." if keys else f"{prefix}.KEY=..."
    return ConfigError(prefix, f"is a section of keys, not a value{got}",
                       f"set its keys one by one, e.g. {example} (adpsgd-run --cfg job lists "
                       "them)")


def typed_section(prefix: str, schema: type, node: Any) -> DictConfig:
    """Merge ``node`` into ``schema``; turn OmegaConf's errors into one line naming the key."""
    base = OmegaConf.structured(schema)
    if node is not None and not isinstance(node, dict):  # OmegaConf would raise a traceback
        raise section_given_a_value(prefix, leaf_keys(base), node)
    try:
        merged = OmegaConf.merge(base, node if node is not None else {})
    except ConfigKeyError as ex:
        key = str(ex.key) if getattr(ex, "key", None) is not None else "?"
        close = difflib.get_close_matches(key, _known_keys(schema), n=1)
        fix = f"{prefix}.{close[0]}=..." if close else (
            f"remove it; known keys: {', '.join(_known_keys(schema))}")
        raise ConfigError(f"{prefix}.{key}", "unknown key", fix) from None
    except ValidationError as ex:
        key = f"{prefix}.{ex.full_key}" if ex.full_key else prefix
        declared = {f.name: f.type for f in dataclasses.fields(schema)}.get(str(ex.key))
        raise type_error(key, ex, declared) from None
    except OmegaConfBaseException as ex:
        raise ConfigError(prefix, one_line(ex.msg if hasattr(ex, "msg") else ex),
                          "check the override") from None
    return merged


def validate(cfg: DictConfig) -> DictConfig:
    """Return a resolved, typed copy of the composed config, or raise ConfigError."""
    try:
        plain = OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as ex:
        raise ConfigError(str(getattr(ex, "full_key", "config")), one_line(ex),
                          "fix the interpolation") from None
    assert isinstance(plain, dict)
    typed: dict[str, Any] = {}
    seed = plain.pop("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ConfigError("seed", f"must be an integer, got {seed!r}", "seed=0")
    typed["seed"] = seed
    typed.update(_resume_keys(plain))
    for section, schema in FIXED_SECTIONS.items():
        typed[section] = typed_section(section, schema, plain.pop(section, None))
    for section, registry in registries().items():
        node = plain.pop(section, None) or {}
        name = node.get("name")
        if name not in registry:
            raise ConfigError(f"{section}.name", f"unknown {registry.kind} {name!r}",
                              f"choose {section}=NAME with NAME one of: "
                              f"{', '.join(registry.names())}")
        typed[section] = typed_section(section, registry.get(name).Config, node)
    for extra_key in plain:  # anything else at the top level is a typo
        close = difflib.get_close_matches(extra_key, list(typed), n=1)
        raise ConfigError(extra_key, "unknown top-level key",
                          f"did you mean {close[0]}?" if close else "remove it")
    result = OmegaConf.create(typed)
    for section, node in typed.items():
        if isinstance(node, DictConfig):
            OmegaConf.to_object(node).check(section, result)
    algorithm = ALGORITHMS.get(result.algo.name)
    algorithm.check_world(result)
    if result.launcher.elastic and not algorithm.elastic:
        elastic = [name for name in ALGORITHMS.names() if ALGORITHMS.get(name).elastic]
        raise ConfigError("launcher.elastic", f"{result.algo.name} cannot go on without a "
                          "learner yet", f"launcher.elastic=false, or algo= one of "
                          f"{', '.join(elastic)}")
    if result.trainer.checkpoint_in_background and not algorithm.background_checkpoints:
        able = [n for n in ALGORITHMS.names() if ALGORITHMS.get(n).background_checkpoints]
        raise ConfigError("trainer.checkpoint_in_background", f"{result.algo.name}'s learners "
                          "meet for a checkpoint (their communication in flight is completed "
                          f"there); only {', '.join(able)} take theirs alone",
                          "trainer.checkpoint_in_background=false")
    OmegaConf.set_struct(result, True)
    return result


def validate_job(cfg: DictConfig) -> DictConfig:
    """:func:`validate`, then the recipe checks that its data is where the config says."""
    typed = validate(cfg)
    if not typed.launcher.get("timing_only"):  # a timing-only simulation reads no data
        RECIPES.get(typed.recipe.name)(typed.recipe).check_data()
    return typed
