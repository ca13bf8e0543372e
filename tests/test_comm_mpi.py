"""Communication layer on real MPI ranks (mpiexec -n 2 and -n 4, oversubscribed on 2 cores)."""

import pytest

from conftest import run_mpi

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("nprocs", [2, 4])
@pytest.mark.parametrize("backend", ["mpi", "gloo"])
def test_collectives_world_layout_and_flat_buffers(nprocs, backend):
    proc = run_mpi(nprocs, "comm_checks.py", backend)
    assert proc.stdout.count("comm checks passed") == nprocs


def test_ssgd_bucket_allreduce_overlaps_backward():
    proc = run_mpi(2, "ssgd_overlap.py")
    assert proc.stdout.count("bucket reductions done before backward ended") == 2
