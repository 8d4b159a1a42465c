# shellcheck shell=bash
# mpiring's job set-up, sourced by slurm/train.sbatch, bench.sbatch and test.sbatch (not run
# on its own). The SITE SET-UP block below is the one place to adapt these scripts to a cluster;
# everything else is driven by environment variables (slurm/README.md lists them all).

# ============================ SITE SET-UP: edit for your cluster ============================
# Modules (Lmod and Environment Modules scripts may trip `set -u`, hence the set +u):
#   set +u; module load gcc/12 openmpi/4.1.6 cuda/12.4; set -u
# Python: the virtualenv in MPIRING_VENV, when set, is activated; or put your own line here:
#   source /path/to/venv/bin/activate        (or: conda activate mpiring)
if [[ -n "${MPIRING_VENV:-}" ]]; then
    # shellcheck disable=SC1091  # the venv is the user's, not ours to lint
    source "$MPIRING_VENV/bin/activate"
fi
# ============================================================================================

# Run from this checkout's sources even when mpiring is not pip-installed.
export PYTHONPATH="$MPIRING_ROOT${PYTHONPATH:+:$PYTHONPATH}"
# Unbuffered Python: the ranks' lines reach the log as they are printed, not at exit.
export PYTHONUNBUFFERED=1

# MPICH's own PMI client (the PyPI wheel's) with `srun --mpi=pmi2`: Slurm's plugin (22.05) reads a
# PMI-1 request in one read of at most 1024 bytes, and MPICH's UCX address exchange sends longer
# ones now and then; they arrive cut ("mpi/pmi2: invalid client request") and MPI_Init fails.
# MPICH's OFI netmod exchanges short addresses, so pick it where MPICH has both (slurm/README.md).
if [[ "${MPIRING_LAUNCHER:-srun}" == srun && "${MPIRING_SRUN_MPI:-pmi2}" == pmi2 && -z "${MPIR_CVAR_CH4_NETMOD:-}" ]] &&
    command -v mpichversion >/dev/null && mpichversion 2>/dev/null | grep -q -- '--with-device=ch4:ucx,ofi'; then
    export MPIR_CVAR_CH4_NETMOD=ofi
fi

# mpiring_out_dir: the directory of this job's log file (#SBATCH --output, or sbatch -o), where
# the job's other outputs go too. Falls back to the submit directory.
mpiring_out_dir() {
    local log
    log=$(scontrol show job "$SLURM_JOB_ID" 2>/dev/null | sed -n 's/^ *StdOut=//p' | head -n 1 || true)
    if [[ "$log" == /* ]]; then dirname "$log"; else echo "${SLURM_SUBMIT_DIR:-$PWD}"; fi
}

# mpiring_launch CMD [ARGS...]: start CMD once per task of the allocation, as one MPI job.
#   MPIRING_LAUNCHER=srun (default): srun --mpi=$MPIRING_SRUN_MPI, pmi2 unless set (pmix for an
#       Open MPI built with PMIx; `srun --mpi=list` shows what this Slurm offers), and
#       --kill-on-bad-exit=1: a rank that fails ends the step at once, instead of leaving the
#       others waiting for it in a collective until the time limit.
#   MPIRING_LAUNCHER=mpirun (or mpiexec): the MPI's own launcher, `-n $SLURM_NTASKS`; MPICH's
#       hydra and Open MPI read the node list from the allocation.
#   MPIRING_LAUNCH_ARGS: extra launcher arguments (split on white space), e.g. "--cpu-bind=cores".
#   MPIRING_GPU_BIND=local-rank: each rank sees only the GPU at its node-local rank
#       (slurm/bind-gpu.sh); any launcher.
mpiring_launch() {
    local -a launcher extra
    read -r -a extra <<<"${MPIRING_LAUNCH_ARGS:-}"
    case "${MPIRING_LAUNCHER:-srun}" in
        srun) launcher=(srun "--mpi=${MPIRING_SRUN_MPI:-pmi2}" --kill-on-bad-exit=1) ;;
        mpirun | mpiexec) launcher=("$MPIRING_LAUNCHER" -n "$SLURM_NTASKS") ;;
        *)
            echo "mpiring: MPIRING_LAUNCHER must be srun, mpirun or mpiexec, not '$MPIRING_LAUNCHER'" >&2
            return 2
            ;;
    esac
    case "${MPIRING_GPU_BIND:-none}" in
        none) ;;
        local-rank) set -- "$MPIRING_ROOT/slurm/bind-gpu.sh" "$@" ;;
        *)
            echo "mpiring: MPIRING_GPU_BIND must be none or local-rank, not '$MPIRING_GPU_BIND'" >&2
            return 2
            ;;
    esac
    echo "+ ${launcher[*]} ${extra[*]} $*" >&2
    "${launcher[@]}" "${extra[@]}" "$@"
}

# Say where and how the job runs, first thing in its log.
echo "mpiring job $SLURM_JOB_ID ($SLURM_JOB_NAME): $SLURM_NTASKS tasks on $SLURM_JOB_NUM_NODES node(s)" \
    "[$SLURM_JOB_NODELIST], launcher ${MPIRING_LAUNCHER:-srun}${MPIR_CVAR_CH4_NETMOD:+ (MPICH netmod $MPIR_CVAR_CH4_NETMOD)}," \
    "checkout $MPIRING_ROOT, python $(command -v python)"
