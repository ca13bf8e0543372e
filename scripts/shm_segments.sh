# Sourced by slurm_local.sh and lab_cluster.sh. An MPI rank killed with -9 leaves its
# shared-memory segments in /dev/shm; these helpers remove the ones nobody uses any more.

remove_unmapped_segments() {  # FIND_TESTS...: remove the /dev/shm files they select that no
    local segment removed=0   # process maps; prints how many went
    while IFS= read -r segment; do
        grep -qsF "$segment" /proc/[0-9]*/maps && continue
        rm -f "$segment" && removed=$((removed + 1))
    done < <(find /dev/shm -maxdepth 1 "$@" 2>/dev/null)
    echo "$removed"
}
