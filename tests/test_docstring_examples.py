"""The ``Example::`` blocks of the Recipe and Algorithm base classes work as written: each
rank of a 2-rank job runs them (they register a recipe and an algorithm), and the example
algorithm trains the example recipe through the one training loop."""

from __future__ import annotations

import re

import pytest

from conftest import case_report, run_mpi_cases

pytestmark = pytest.mark.mpi


def test_the_example_algorithm_trains_the_example_recipe(tmp_path):
    lines = run_mpi_cases(2, "docstring_examples.py", tmp_path,
                          {"examples": ["trainer.epochs=3", "trainer.batch_size=16"]})
    report = case_report(lines, "examples", 2)
    steps, averagings, top1 = re.search(r"steps (\d+) averagings (\d+) top1 ([\d.]+)",
                                        report).groups()
    # 400 training samples, 2 x 16 per step: 13 steps an epoch; an average every 4th step.
    assert int(steps) == 39 and int(averagings) == 39 // 4, report
    # Two Gaussian blobs 2 standard deviations apart along each axis: a linear model
    # separates ~92% of them; chance is 50%.
    assert float(top1) > 80, report
