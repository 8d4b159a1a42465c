#!/usr/bin/env bash
# bind-gpu.sh CMD [ARGS...]: run CMD seeing only the GPU at this rank's node-local rank.
#
# One rank per GPU: the launcher starts this once per rank (slurm/site.sh does it when
# MPIRING_GPU_BIND=local-rank). The node-local rank comes from the MPI launcher when there is one
# (MPICH's hydra: MPI_LOCALRANKID; Open MPI: OMPI_COMM_WORLD_LOCAL_RANK), else from srun
# (SLURM_LOCALID). Order matters: under mpirun inside Slurm, SLURM_LOCALID is that of hydra's
# proxy, the same for every rank on a node.
#
# The rank picks the local-rank-th entry of the CUDA_VISIBLE_DEVICES Slurm gave the job (entry, not
# number: a job given GPUs 2,3 of a node must not be sent to GPU 0), or GPU local-rank when no
# list was given. CuPy's device 0 is then the rank's own GPU.
set -euo pipefail

local_rank=${MPI_LOCALRANKID:-${OMPI_COMM_WORLD_LOCAL_RANK:-${SLURM_LOCALID:-}}}
if [[ -z "$local_rank" ]]; then
    echo "bind-gpu.sh: no node-local rank (MPI_LOCALRANKID, OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID)" >&2
    exit 2
fi
if [[ -n "${CUDA_VISIBLE_DEVICES:-}" ]]; then
    IFS=, read -r -a gpus <<<"$CUDA_VISIBLE_DEVICES"
    if ((local_rank >= ${#gpus[@]})); then
        echo "bind-gpu.sh: node-local rank $local_rank but only ${#gpus[@]} GPU(s) visible" \
            "(CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES): ask for one GPU per task on each node" >&2
        exit 2
    fi
    export CUDA_VISIBLE_DEVICES=${gpus[$local_rank]}
else
    export CUDA_VISIBLE_DEVICES=$local_rank
fi
exec "$@"
