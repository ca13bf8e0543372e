"""launcher=sim runs the algorithms' own rules: at n=4 (float64, the same seed) every lockstep
algorithm ends with the real ranks' model, and AD-PSGD/H-ADPSGD replaying a real run's
recorded operations (algo.record_trace=true, launcher.replay) end with its model, to 1e-10;
and each simulated learner counts the bytes its rank sent (summary.json's ``bytes_sent``)."""

import json
import sys

import pytest
import torch

from runner.sim.drivers import SIM_DRIVERS

from conftest import MPI_SCRIPTS, RULES_DIGITS, case_report, run_mpi_cases

pytestmark = pytest.mark.mpi

COMMON = ["launcher.nprocs=4", "launcher.procs_per_node=2", "trainer.epochs=1",
          "trainer.dtype=float64", "trainer.batch_size=16", "optim.weight_decay=1e-4",
          *RULES_DIGITS]  # the rules are compared, not what they learn
CASES = {
    "ssgd": ["algo=ssgd"],
    "dpsgd_ring": ["algo=dpsgd", "topology=ring"],
    "dpsgd_random_ring": ["algo=dpsgd", "topology=random_ring"],
    "dpsgd_exponential": ["algo=dpsgd", "topology=exponential"],
    "dpsgd_step_then_average": ["algo=dpsgd", "algo.ordering=step_then_average"],
    "local_sgd": ["algo=local_sgd", "algo.period=3"],
    "dasgd": ["algo=dasgd"],
    "delay_by_one": ["algo=adpsgd", "algo.delay_by_one=true"],
    "sgp": ["algo=sgp"],
    "sgp_overlap": ["algo=sgp", "algo.overlap=true"],
    "diloco": ["algo=diloco", "algo.period=3"],
    "choco_topk": ["algo=choco", "algo.compression=topk", "algo.ratio=0.1"],
    "choco_qsgd": ["algo=choco", "algo.compression=qsgd", "algo.levels=15"],
    # Lower precision on the wire: the simulator charges and counts the smaller messages but
    # does not round (its models are not compared).
    "dpsgd_ring_bfloat16": ["algo=dpsgd", "topology=ring", "comm.exchange_dtype=bfloat16"],
    "choco_topk_float16": ["algo=choco", "algo.compression=topk", "algo.ratio=0.1",
                           "comm.exchange_dtype=float16"],
    "adpsgd": ["algo=adpsgd", "algo.record_trace=true", "faults.delay_s=0.003"],
    "hadpsgd": ["algo=hadpsgd", "algo.record_trace=true", "faults.delay_s=0.003"],
}
# A driver no case names (a new algorithm's) is compared in its default setting.
CASES.update({name: [f"algo={name}"] for name in SIM_DRIVERS.names()
              if not any(f"algo={name}" in overrides for overrides in CASES.values())})


@pytest.fixture(scope="module")
def real_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("sim_eq")
    lines = run_mpi_cases(4, "sim_equivalence.py", root,
                          {name: [*COMMON, *o] for name, o in CASES.items()}, timeout=600)
    return root, lines


def simulate(overrides: list[str], run_dir) -> tuple[dict, dict]:
    """The simulated run's final model and summary."""
    sys.path.insert(0, str(MPI_SCRIPTS))
    from runner.sim.engine import Simulation

    from harness import compose_config

    summary = Simulation(compose_config(overrides), run_dir).run()
    model = torch.load(run_dir / "checkpoints" / "final_rank0.pt", weights_only=False)["model"]
    return model, summary


@pytest.mark.parametrize("case", list(CASES))
def test_simulated_model_equals_the_real_one(real_runs, case, tmp_path):
    root, lines = real_runs
    case_report(lines, case, 4)
    real = torch.load(root / case / "checkpoints" / "final_rank0.pt",
                      weights_only=False)["model"]
    overrides = [*COMMON, *CASES[case], "launcher=sim", "launcher.nprocs=4",
                 "launcher.procs_per_node=2"]
    if "algo.record_trace=true" in overrides:  # replay the real run's operations
        overrides += [f"launcher.replay={root / case / 'trace'}"]
    simulated, summary = simulate(overrides, tmp_path / "sim")
    worst = max(float((real[k] - simulated[k]).abs().max()) for k in real)
    rounded = any(o.startswith("comm.exchange_dtype=") for o in overrides)
    assert rounded or worst <= 1e-10, f"{case}: the simulated model differs by {worst:.3g}"
    real_sent = json.loads((root / case / "summary.json").read_text())["bytes_sent"]
    assert summary["bytes_sent"]["by_kind"] == real_sent["by_kind"], case
    assert real_sent["mean_per_step"] > 0, real_sent
