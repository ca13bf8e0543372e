/*
 * pmix_quiet: keeps an elastic job's failure reports inside MPI under SLURM.
 *
 * Built by `make install` into .venv/ulfm/lib/adpsgd_pmix_quiet.so and preloaded into the
 * ranks of `launcher=slurm launcher.elastic=true` jobs only (runner/launch/mpi_flavour.py).
 *
 * Why: when a rank of Open MPI 5 with ULFM sees a peer fail, it tells its peers (a reliable
 * broadcast among the ranks) and also raises a PMIx event for its runtime. Under srun
 * --mpi=pmix the runtime is SLURM's PMIx plugin in slurmstepd, whose error handler cancels the
 * whole step on any event ("Error handler invoked: status = -200", then "STEP ... CANCELLED"),
 * so every survivor of a lost rank was killed a moment after MPI reported the failure.
 * That one event is dropped here; every other call goes to the real PMIx_Notify_event.
 * The survivors still learn of the failure from MPI and from adpsgd's launcher.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>

/* PMIx 4's pmix_common.h: the status Open MPI reports a failed peer with. */
#define PMIX_ERR_PROC_TERM_WO_SYNC (-200)
#define PMIX_SUCCESS 0

typedef int (*notify_event_fn)(int status, const void *source, int range, const void *info,
                               size_t ninfo, void *cbfunc, void *cbdata);

int PMIx_Notify_event(int status, const void *source, int range, const void *info,
                      size_t ninfo, void *cbfunc, void *cbdata)
{
    static notify_event_fn real;
    if (status == PMIX_ERR_PROC_TERM_WO_SYNC && cbfunc == NULL) {
        /* Open MPI's report (ompi_errhandler_proc_failed_internal): no callback to call */
        return PMIX_SUCCESS;
    }
    if (real == NULL) {
        real = (notify_event_fn)dlsym(RTLD_NEXT, "PMIx_Notify_event");
        if (real == NULL) {
            return -1; /* PMIX_ERROR: no PMIx library is loaded after this one */
        }
    }
    return real(status, source, range, info, ninfo, cbfunc, cbdata);
}
