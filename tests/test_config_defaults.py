"""Each default is written once: in its schema (runner/config/run_schema.py and every registered
algorithm's, recipe's, topology's and launcher's Config dataclass). A YAML file of conf/ may
only set what differs from what it extends: its schema, the recipe it builds on, or, for an
experiment preset, the configs its group choices compose."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from runner.commands.compose import CONFIG_MODULE, registries
from runner.config.cluster import ClusterConfig
from runner.config.run_schema import RunConfig

from conftest import REPO

CONF = REPO / "conf"
GROUPS = ("algo", "topology", "launcher")


def flat(node, prefix: str = "") -> dict:
    out = {}
    for key, value in node.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def schema(cls, **values) -> dict:
    return OmegaConf.to_container(OmegaConf.structured(cls(**values)), resolve=False,
                                  throw_on_missing=False)


def composed(overrides: list[str]) -> dict:
    with initialize_config_module(config_module=CONFIG_MODULE, version_base=None):
        cfg = compose("config", overrides=overrides)
    return flat(OmegaConf.to_container(cfg, resolve=False))


def run_defaults() -> dict:
    top = schema(RunConfig)
    return flat({k: v for k, v in top.items() if v != "???"})


def baseline(path: Path, data: dict) -> dict:
    """What the keys of ``path`` would be without it."""
    group, name = path.parent.name, path.stem
    defaults = [d for d in data.get("defaults", []) if d != "_self_"]
    if path == CONF / "config.yaml":
        return run_defaults()
    if group in GROUPS:
        return flat(schema(registries()[group].get(name).Config, name=name))
    if group == "cluster":  # one schema for every machine
        return flat(schema(ClusterConfig))
    if group == "recipe":
        parents = [d for d in defaults if isinstance(d, str) and not d.startswith("/")]
        if parents:  # builds on another recipe
            return composed([f"recipe={parents[0]}"])
        return {**run_defaults(), **flat(schema(registries()["recipe"].get(name).Config,
                                                name=name), "recipe.")}
    if group == "experiment":  # on top of what its group choices compose
        choices = [f"{k.split('/')[-1]}={v}" for d in defaults if isinstance(d, dict)
                   for k, v in d.items()]
        return composed(choices)
    raise AssertionError(f"no rule for {path}")


YAMLS = sorted(CONF.rglob("*.yaml"))


@pytest.mark.parametrize("path", YAMLS, ids=[str(p.relative_to(CONF)) for p in YAMLS])
def test_a_yaml_file_sets_only_what_differs(path):
    data = yaml.safe_load(path.read_text()) or {}
    body = {k: v for k, v in data.items() if k not in ("defaults", "hydra")}
    base = baseline(path, data)
    restated = {key: value for key, value in flat(body).items()
                if key in base and base[key] == value}
    assert not restated, f"{path.relative_to(REPO)} restates defaults: {restated}"


def test_every_group_file_extends_its_schema():
    for group in (*GROUPS, "recipe"):
        for path in sorted((CONF / group).glob("*.yaml")):
            defaults = (yaml.safe_load(path.read_text()) or {}).get("defaults", [])
            extends = [d for d in defaults if isinstance(d, str)
                       and d.startswith(f"/schema/{group}/{path.stem}@")]
            parent = [d for d in defaults if isinstance(d, str) and not d.startswith("/")
                      and d != "_self_"]
            assert extends or parent, f"{path.relative_to(REPO)} extends no schema"
            assert path.stem in registries()[group], f"{path.stem} is no registered {group}"


def test_the_schemas_are_what_composes():
    """With no YAML values, the composed config is the schemas' defaults: the local launcher's
    default job of 4 ranks in nodes of 2 lives in LocalConfig, not in a YAML file."""
    cfg = composed([])
    assert cfg["launcher.nprocs"] == 4 and cfg["launcher.procs_per_node"] == 2
    assert cfg["trainer.keep_checkpoints"] == run_defaults()["trainer.keep_checkpoints"]


def test_schemas_are_stored_again_when_a_registry_changes_or_the_store_lost_them():
    """register_schemas() skips the store while nothing changed (a third of a composition),
    but a choice registered since, or a store emptied (Hydra's is a process-wide singleton),
    gets every schema stored again."""
    from hydra.core.config_store import ConfigStore

    import recipes  # noqa: F401 - the commands import them first
    from runner.commands.compose import compose_all, register_schemas
    from runner.recipe import RECIPES

    store = ConfigStore.instance().repo
    compose_all(["algo=ssgd"], False, "config")
    recipe = RECIPES.get("digit_images")
    RECIPES.register("schema_cache_check")(recipe)
    try:
        register_schemas()
        assert "schema_cache_check.yaml" in store["schema"]["recipe"]
    finally:
        del RECIPES._entries["schema_cache_check"]
        del store["schema"]["recipe"]["schema_cache_check.yaml"]
    del store["schema"]["run.yaml"]
    assert compose_all(["algo=ssgd"], False, "config")[0].algo.name == "ssgd"
    assert "run.yaml" in store["schema"]
