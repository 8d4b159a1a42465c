#!/usr/bin/env bash
# Everything mpiring measures and tests on a GPU machine, in phases: the machine's facts, the GPU
# tests, the bandwidth check, small-call latency and its profile, the host-copies crossover, the
# benchmark and the training demo on device buffers, and a CUDA-aware Open MPI for the direct path
# (built in the background). Run from the repository root on a machine with CuPy and Python 3.12:
#
#   OUT=results/gpu bash scripts/gpu_run.sh [phase ...]      # phases: see the bottom; default all
#
# Needs, in the repository root (docs/gpu.md, "Reproducing"):
#   .whl/      mpich, mpi4py and pytest-mpi wheels for Python 3.12
#   .gpu-src/  openmpi_*.orig.tar.xz (Debian's source of Open MPI) and mpi4py-*.tar.gz, for "ompi"
# "mps" starts the CUDA MPS daemon: ranks sharing one GPU then run their kernels side by side
# instead of time-slicing the GPU (docs/gpu.md, "Several ranks on one GPU"); start it first.
# Writes every log under $OUT (packed into $OUT/logs.tgz at the end); prints a short summary last.
# Each phase has its own time limit, and the whole run stops starting phases past $DEADLINE
# seconds (default 560). Knobs: GPUTEST_SIZES (world sizes of "gputests", default 1 2 4);
# CHECK_ARGS (extra flags of "check2"/"check4"); CROSSOVER_RANKS, CROSSOVER_IPC,
# CROSSOVER_HOST_BYTES, CROSSOVER_SIZES ("crossover"); TRAIN_SIZES, TRAIN_STRATEGIES ("train");
# DIRECT_TEST_SIZES / DIRECT_CHECK_SIZES ("direct"); TORCH_SIZES, TORCH_DDP_SIZES ("torch": the
# torch backend's tests, DDP on CUDA tensors among them, and examples/torch_ddp.py on the GPU,
# with the image's PyTorch; not among the default phases). "repeat4" (MPICH) and "ompi4" (the
# CUDA-aware Open MPI; needs "ompi" first in the same call) run the GPU tests at 4 ranks again and
# again: MPICH_REPEATS / OMPI_REPEATS times at most (default 5 / 3), within REPEAT4_LIMIT /
# OMPI4_LIMIT seconds.
set -uo pipefail
OUT=${OUT:-results/gpu}
DEADLINE=${DEADLINE:-560}
mkdir -p "$OUT"; export OUT
START=$SECONDS
GPU_TESTS="tests/test_gpu.py tests/test_gpu_path_selection.py tests/test_gpu_ipc.py tests/test_gpu_host_route.py"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"

note() { echo "$*" | tee -a "$SUMMARY"; }

# phase NAME LIMIT_SECONDS COMMAND...: run it with a time limit, log to $OUT/NAME.log, record rc.
phase() {
    local name=$1 limit=$2; shift 2
    local left=$((DEADLINE - (SECONDS - START)))
    if ((left < 20)); then note "$name: SKIPPED (time)"; return; fi
    ((limit > left)) && limit=$left
    echo "=== $name (limit ${limit}s) ==="
    local t0=$SECONDS
    PHASE_END=$(($(date +%s) + limit)) timeout -k 5 "$limit" bash -c "$*" > "$OUT/$name.log" 2>&1
    local rc=$?
    note "$name: rc=$rc $((SECONDS - t0))s $(grep -a -E '^[0-9]+ passed, [0-9]+ failed' "$OUT/$name.log" | tail -1)"
}

install_wheels() {
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    # pip --target leaves out a wheel's data/lib: MPICH's libmpi.so.12 is there
    python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall('/tmp/mpich-wheel')" .whl/mpich-*.whl
    mkdir -p /tmp/site/lib && cp -a /tmp/mpich-wheel/mpich-*.data/data/lib/. /tmp/site/lib/
}
# The image has Debian's Open MPI and an mpi4py of its own: name the carried MPICH explicitly, or
# mpi4py loads Open MPI and every rank of MPICH's mpirun runs as a singleton.
use_mpich() {
    export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH LD_LIBRARY_PATH=/tmp/site/lib:${LD_LIBRARY_PATH:-}
    export MPI4PY_LIBMPI=/tmp/site/lib/libmpi.so.12 MPI4PY_MPIABI=mpich
}

facts() {
    nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current \
        --format=csv > "$OUT/facts.txt" 2>&1
    {
        nvidia-smi topo -m
        nproc; free -g | head -2
        python3 -c "import sys, numpy, cupy; print(sys.version); print('numpy', numpy.__version__, 'cupy', cupy.__version__, 'cuda runtime', cupy.cuda.runtime.runtimeGetVersion(), 'driver', cupy.cuda.runtime.driverGetVersion())"
        echo "--- the image's own mpi4py and MPI:"
        (cd /tmp && env -u PYTHONPATH python3 -c "import mpi4py; print('mpi4py', mpi4py.__version__, mpi4py.__file__); from mpi4py import MPI; print(MPI.Get_library_version())") 2>&1 | head -5
        which mpirun mpiexec ompi_info mpichversion nvcc 2>&1
        nvcc --version | tail -2
        ls /usr/lib/x86_64-linux-gnu 2>/dev/null | grep -i -E "libmpi|ucx|nccl" | head
        find / -xdev \( -name 'libmpi.so*' -o -name 'ompi_info' \) 2>/dev/null | grep -v /tmp/ | head
    } >> "$OUT/facts.txt" 2>&1
    cat "$OUT/facts.txt" | head -12
}

# Open MPI from Debian's source, configured with CUDA (smcuda: device buffers by CUDA IPC within a
# node), then mpi4py built against it. Runs in the background; "direct" waits for it.
build_ompi() {
    if [ -f .gpu-src/ompi-install.tar.xz ]; then   # built by an earlier run of this phase
        tar xJf .gpu-src/ompi-install.tar.xz -C /tmp && echo OMPI_BUILT && return 0
    fi
    local cuda; cuda=$(dirname "$(dirname "$(readlink -f "$(which nvcc)")")")
    mkdir -p /tmp/ompi-build && cd /tmp/ompi-build || return 1
    tar xJf "$OLDPWD"/.gpu-src/openmpi_*.orig.tar.xz && cd openmpi-* || return 1
    ./configure --prefix=/tmp/ompi --with-cuda="$cuda" --disable-mpi-fortran --disable-oshmem \
        --without-ucx --without-ofi --without-verbs --without-psm2 --without-hcoll --disable-io-romio \
        --enable-mca-no-build=btl-uct,btl-usnic > configure.log 2>&1 || { tail -30 configure.log; return 1; }
    grep -i "cuda" configure.log | tail -5
    make -j12 > make.log 2>&1 || { grep -B5 -i "error" make.log | tail -40; return 1; }
    make install > install.log 2>&1 || { tail -20 install.log; return 1; }
    /tmp/ompi/bin/ompi_info --parsable --all | grep -i "mpi_built_with_cuda_support:value"
    echo OMPI_BUILT
    tar cf - -C /tmp ompi | xz -T8 -3 > "$OUT/ompi-install.tar.xz"   # carry it to the next run
}

with_ompi() {
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
    export PATH=/tmp/ompi/bin:$PATH LD_LIBRARY_PATH=/tmp/ompi/lib MPI4PY_LIBMPI=/tmp/ompi/lib/libmpi.so.40
    export MPI4PY_MPIABI=openmpi PYTHONPATH=/tmp/site:$PWD
}

wait_ompi() {
    for _ in $(seq 1 400); do grep -q -E "OMPI_BUILT|FAILED" "$OUT/ompi-build.log" 2>/dev/null && break; sleep 1; done
    grep -q OMPI_BUILT "$OUT/ompi-build.log" || { echo "no CUDA-aware Open MPI was built"; return 1; }
}

# repeat_tests LABEL REPEATS TEST...: the GPU tests at $REPEAT_SIZE ranks (default 4), REPEATS
# times at most, starting a repeat only while one more fits before the phase's end ($PHASE_END,
# seconds since the epoch). A stall raises CollectiveTimeout (tests/test_gpu.py: 120 s) or trips
# pytest-timeout at 150 s, which dumps every thread's stack. One summary line per repeat; the pool
# test's per-rank warm-up lengths go to $OUT/pool-warmup.txt.
repeat_tests() {
    local label=$1 repeats=$2; shift 2
    local last=0 i t0 line
    export MPIRING_GPU_TEST_REPORT=$OUT/pool-warmup.txt
    for i in $(seq 1 "$repeats"); do
        if (($(date +%s) + last + 15 > PHASE_END)); then echo "$label repeat $i: not started (time)"; break; fi
        t0=$(date +%s)
        python3 tests/run_world_sizes.py --no-serial --test-timeout 150 --sizes "${REPEAT_SIZE:-4}" -- "$@" \
            > "$OUT/$label-repeat-$i.log" 2>&1
        last=$(($(date +%s) - t0))
        line=$(grep -a -E "world size" "$OUT/$label-repeat-$i.log" | tail -1)   # -a: Open MPI logs hold NULs
        echo "$label repeat $i (${last}s):$line" | tee -a "$OUT/summary.txt"
        if grep -q -a -E "FAIL|CollectiveTimeout|Timeout" "$OUT/$label-repeat-$i.log"; then
            grep -a -E -B2 -A30 "CollectiveTimeout|Timeout \+|FAILED|Error" "$OUT/$label-repeat-$i.log" | head -80
        fi
    done
    return 0  # a failure shows in the summary lines; a clean repeat must not end the phase with grep's 1
}

direct() {
    wait_ompi || return 1
    with_ompi
    python3 -c "from mpi4py import MPI; print(MPI.Get_library_version())" || {
        echo "the mpi4py wheel does not load this Open MPI: building mpi4py from source";
        (cd /tmp && tar xzf "$OLDPWD"/.gpu-src/mpi4py-*.tar.gz && cd mpi4py-* && \
         MPICC=/tmp/ompi/bin/mpicc python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/site-ompi .) || return 1
        export PYTHONPATH=/tmp/site-ompi:$PYTHONPATH; unset MPI4PY_LIBMPI MPI4PY_MPIABI; }
    MPIRING_DEBUG=1 mpirun -n 2 python3 -m mpiring info
    python3 tests/run_world_sizes.py --no-serial --sizes ${DIRECT_TEST_SIZES:-1 2 4} -- tests/test_gpu.py
    for n in ${DIRECT_CHECK_SIZES:-2 4}; do
        mpirun -n $n python3 -m mpiring.gpu.check --sizes-mib 1 16 64 256 --json "$OUT/check-direct-$n.json"
    done
}

run_phases() {
    for p in "$@"; do
        case $p in
            facts) phase facts 60 "$(declare -f facts); facts" ;;
            ompi) (setsid bash -c "$(declare -f build_ompi); build_ompi; echo rc=\$? FAILED_IF_NOT_BUILT" \
                    > "$OUT/ompi-build.log" 2>&1 &) ;;
            info) phase info 60 "$(declare -f use_mpich); use_mpich; python3 -m mpiring info; MPIRING_DEBUG=1 mpirun -n 4 python3 -m mpiring info" ;;
            gputests) phase gputests 500 "$(declare -f use_mpich); use_mpich; python3 tests/run_world_sizes.py --no-serial --test-timeout 150 --sizes ${GPUTEST_SIZES:-1 2 4} -- $GPU_TESTS" ;;
            gputests-device) phase gputests-device 500 "$(declare -f use_mpich); use_mpich; export MPIRING_GPU_HOST_BYTES=0; python3 tests/run_world_sizes.py --no-serial --test-timeout 150 --sizes ${GPUTEST_SIZES:-1 2 4} -- $GPU_TESTS" ;;
            crossover) phase crossover 150 "$(declare -f use_mpich); use_mpich; for n in ${CROSSOVER_RANKS:-2}; do for ipc in ${CROSSOVER_IPC:-1 0}; do for hb in ${CROSSOVER_HOST_BYTES:-0 65536}; do echo ranks \$n MPIRING_GPU_IPC=\$ipc MPIRING_GPU_HOST_BYTES=\$hb; MPIRING_GPU_IPC=\$ipc MPIRING_GPU_HOST_BYTES=\$hb mpirun -n \$n python3 -m mpiring.bench --device gpu -c allreduce ${CROSSOVER_SIZES:--b 8 -e 4M -f 8} -n 20 --reps 3 -w 5 --json $OUT/crossover-\$n-ipc\$ipc-host\$hb.json; done; done; done" ;;
            repeat4) phase repeat4 "${REPEAT4_LIMIT:-560}" "$(declare -f use_mpich repeat_tests); use_mpich; repeat_tests mpich ${MPICH_REPEATS:-5} $GPU_TESTS" ;;
            ompi4) phase ompi4 "${OMPI4_LIMIT:-560}" "$(declare -f with_ompi wait_ompi repeat_tests); wait_ompi && with_ompi && repeat_tests ompi ${OMPI_REPEATS:-3} tests/test_gpu.py" ;;
            torch) phase torch 400 "$(declare -f use_mpich); use_mpich; python3 tests/run_world_sizes.py --no-serial --test-timeout 150 --sizes ${TORCH_SIZES:-1 2 4} -- tests/test_torch_backend.py; for n in ${TORCH_DDP_SIZES:-2 4}; do MPIRING_TORCH_PROGRESS=1 mpirun -n \$n python3 examples/torch_ddp.py --device gpu --overlap --steps 10 --width 256 --bucket-mb 1 || echo FAIL ddp \$n; done" ;;
            suite) phase suite 400 "$(declare -f use_mpich); use_mpich; python3 tests/run_world_sizes.py --sizes 1 2 4 -- -k 'not slurm'" ;;
            build) phase build 60 "python3 setup.py -q build_ext --inplace && ls mpiring/engine/" ;;
            check2) phase check2 120 "$(declare -f use_mpich); use_mpich; mpirun -n 2 python3 -m mpiring.gpu.check ${CHECK_ARGS:-} --json $OUT/check2.json" ;;
            check4) phase check4 120 "$(declare -f use_mpich); use_mpich; mpirun -n 4 python3 -m mpiring.gpu.check ${CHECK_ARGS:-} --json $OUT/check4.json" ;;
            profile) phase profile 90 "$(declare -f use_mpich); use_mpich; for ipc in 1 0; do MPIRING_DEBUG=1 MPIRING_GPU_IPC=\$ipc mpirun -n 2 python3 scripts/profile_device_call.py --bytes 8 --calls 2000; done" ;;
            sharing) phase sharing 60 "$(declare -f use_mpich); use_mpich; for n in 1 2 4; do mpirun -n \$n python3 scripts/measure_gpu_sharing.py; done" ;;
            mps) phase mps 20 "ls /usr/local/nvidia/bin; export PATH=\$PATH:/usr/local/nvidia/bin; setsid nvidia-cuda-mps-control -d; sleep 1; ls -la /tmp/nvidia-mps" ;;
            small) phase small 120 "$(declare -f use_mpich); use_mpich; for ipc in 1 0; do MPIRING_GPU_IPC=\$ipc mpirun -n 2 python3 -m mpiring.bench --device gpu -c allreduce -b 8 -e 4K -f 8 -n 50 --reps 3 -w 10 --json $OUT/small-ipc\$ipc.json; done" ;;
            segments) phase segments 150 "$(declare -f use_mpich); use_mpich; for s in 262144 1048576 4194304 16777216; do echo segment \$s; MPIRING_GPU_SEGMENT_BYTES=\$s mpirun -n 2 python3 -m mpiring.gpu.check --sizes-mib 16 64 --repeats 3; done" ;;
            hostbench) phase hostbench 120 "$(declare -f use_mpich); use_mpich; mpirun -n 2 python3 -m mpiring.bench -c allreduce -b 1M -e 256M -f 4 -n 5 --reps 3 -w 2" ;;
            bench) phase bench 200 "$(declare -f use_mpich); use_mpich; for c in allreduce allgather reduce_scatter broadcast; do mpirun -n 2 python3 -m mpiring.bench --device gpu -c \$c -b 1K -e 256M -f 4 -n 3 --reps 2 -w 1 --json $OUT/bench-\$c.json --plot $OUT/bench-\$c.png; done" ;;
            benchstaged) phase benchstaged 200 "$(declare -f use_mpich); use_mpich; export MPIRING_GPU_IPC=0; for c in allreduce allgather reduce_scatter broadcast; do mpirun -n 2 python3 -m mpiring.bench --device gpu -c \$c -b 1K -e 256M -f 4 -n 3 --reps 2 -w 1 --json $OUT/benchstaged-\$c.json --plot $OUT/benchstaged-\$c.png; done" ;;
            train) phase train 200 "$(declare -f use_mpich); use_mpich; for n in ${TRAIN_SIZES:-1 2 4}; do for s in ${TRAIN_STRATEGIES:-ddp zero1 zero2 zero3}; do for d in cpu gpu; do mpirun -n \$n python3 examples/train.py --strategy \$s --device \$d --steps 20 --log-every 0 --sample-chars 0 --report $OUT/train-\$n-\$s-\$d.json > $OUT/train-\$n-\$s-\$d.log 2>&1 || echo FAIL \$n \$s \$d; done; done; done; python3 scripts/compare_training_runs.py $OUT/train-*.json" ;;
            direct) phase direct 300 "$(declare -f direct with_ompi); direct" ;;
            *) note "unknown phase $p" ;;
        esac
    done
}

install_wheels
if (($# == 0)); then set -- mps facts build ompi info gputests check2 check4 profile small crossover train hostbench direct bench benchstaged segments suite; fi
run_phases "$@"
note "total $((SECONDS - START))s"
cat "$SUMMARY"
# The device tool brings back at most 8 files: everything but the build goes in one archive.
(cd "$OUT" && tar czf logs.tgz --exclude=logs.tgz --exclude=ompi-install.tar.xz -- * && \
    find . -maxdepth 1 -type f ! -name logs.tgz ! -name ompi-install.tar.xz ! -name summary.txt -delete)
