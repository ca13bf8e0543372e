"""mpiexec -n 2 python docstring_examples.py RUN_DIR CASES_JSON: the ``Example::`` blocks of the
Recipe and Algorithm base classes, run as written in every rank (they register themselves),
train together with the one training loop (tests/test_docstring_examples.py)."""

import inspect
import re
import textwrap

from omegaconf import OmegaConf, open_dict

from runner.algos import Algorithm
from runner.comm.communicator import Communicator
from runner.recipe import Recipe

from harness import build_trainer, compose_config, run_cases_on_ranks


def example(cls) -> dict:
    """Run the class docstring's ``Example::`` block; return what it defined."""
    block = re.search(r"Example::\n\n(.*?)(?=\n\S|\Z)", inspect.getdoc(cls), re.S)
    namespace: dict = {}
    exec(textwrap.dedent(block.group(1)), namespace)  # noqa: S102 - our own docstring
    return namespace


def train(world_mpi, run_dir, overrides):
    recipe, algo = example(Recipe), example(Algorithm)
    cfg = compose_config(["algo=ssgd", "launcher.nprocs=2", *overrides])
    with open_dict(cfg):
        cfg.recipe = OmegaConf.structured(recipe["TwoBlobsConfig"](name="two_blobs"))
        cfg.algo = OmegaConf.structured(
            algo["PeriodicAveragingConfig"](name="periodic_averaging"))
    comm = Communicator(world_mpi, "mpi")
    trainer, node = build_trainer(world_mpi, comm, run_dir, cfg)
    trainer.run()
    stats = trainer.algo.stats()
    top1 = trainer.evaluator.score(False, False).results["eval"]["top1"]  # the averaged model
    node.close()
    comm.close()
    return f"steps {trainer.state.step} averagings {stats['averagings']} top1 {top1:.1f}"


run_cases_on_ranks(train)
