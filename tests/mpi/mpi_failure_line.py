"""mpiexec -n 1 python mpi_failure_line.py: the line a rank prints when an MPI call fails, for
real mpi4py exceptions of two classes: the one MPICH raises in a collective whose peer died
(its text says only "See the MPI_ERROR field in MPI_Status") and another one."""

from pathlib import Path

from mpi4py import MPI

from runner.rank import mpi_failure_line

for code in (MPI.ERR_IN_STATUS, MPI.ERR_OTHER):
    print(mpi_failure_line(0, MPI.Exception(code), Path("/runs/x/logs/rank0.log")), flush=True)
