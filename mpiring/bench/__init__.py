"""mpiring's benchmark: every collective against mpi4py's native one and a point-to-point
ceiling, in one run, nccl-tests style (`python -m mpiring.bench --help`).

- `table`: one row per collective (sizes, buffers, our call, native call, bus factor, ceiling
  schedule): everything that differs between collectives;
- `harness`: sweep, buffers, check and the numbers of each row, once for all of them;
- `timing`: how a call is timed (barrier, interleaved batches, warm-up) and the one statistic,
  shared with `mpiring.gpu.check` and scripts/measure_*.py;
- `report`: aligned table, CSV, JSON, plot;
- `options`, `device`, `cli`: flags, host or GPU buffers, entry point;
- `launch`: the environment an mpirun of the PyPI MPI wheels needs here (tests, scripts).
"""
