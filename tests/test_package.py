"""Serial tests: segment arithmetic, the public surface, the command line, and what the C replay reads by name."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

import mpiring
from mpiring.algorithms import ALGORITHMS
from mpiring.algorithms.broadcast_ring import SEGMENT_BYTES, segment_count
from mpiring.algorithms.reduce_scatter_ring_pipelined import segments
from mpiring.backend import NUMPY
from mpiring.engine.partition import bounds_from_counts, split_bounds
from mpiring.engine.ring import Ring


@pytest.mark.parametrize("total", [0, 1, 2, 7, 8, 100, 1001])
@pytest.mark.parametrize("parts", [1, 2, 3, 4, 8, 13])
def test_split_bounds_cuts_like_array_split(total, parts):
    bounds = split_bounds(total, parts)
    pieces = np.array_split(np.arange(total), parts)
    assert len(bounds) == parts + 1
    assert [bounds[i + 1] - bounds[i] for i in range(parts)] == [len(p) for p in pieces]
    assert all(np.array_equal(np.arange(total)[bounds[i]:bounds[i + 1]], pieces[i]) for i in range(parts))


def test_bounds_from_counts():
    assert bounds_from_counts([2, 0, 3], scale=4) == [0, 8, 8, 20]


def test_broadcast_segments():
    assert segment_count(10 * SEGMENT_BYTES, 2) == 1  # two ranks: nothing to pipeline
    assert segment_count(SEGMENT_BYTES, 4) == 1
    assert segment_count(SEGMENT_BYTES + 1, 4) == 2


def test_pipelined_segments():
    assert segments(0, 4) == []  # an empty chunk sends nothing
    assert segments(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert segments(8, 4) == [(0, 4), (4, 8)]
    assert segments(3, 1) == [(0, 1), (1, 2), (2, 3)]


def test_scratch_pool_reuses_large_buffers_only_after_a_clean_exit():
    from mpi4py import MPI

    ring = Ring(MPI.COMM_SELF)
    with ring.scratch(NUMPY, 10, np.float32) as small:
        assert small.shape == (10,) and small.dtype == np.float32
    assert ring.scratch_pool._spare.get("numpy", []) == []  # small buffers are not pooled
    with ring.scratch(NUMPY, 1 << 16, np.float64) as big:
        first = big.__array_interface__["data"][0]
    with ring.scratch(NUMPY, 1 << 15, np.float32) as again:  # smaller: the same memory serves
        assert again.__array_interface__["data"][0] == first and again.shape == (1 << 15,)
    with pytest.raises(RuntimeError), ring.scratch(NUMPY, 1 << 16, np.float64):
        raise RuntimeError("the collective failed: MPI may still write to the buffer")
    assert ring.scratch_pool._spare["numpy"] == []  # the failed collective's buffer is not handed out again
    for size in range(4, 10):  # 64 KiB .. 144 KiB, each too large for the buffers before it
        with ring.scratch(NUMPY, size << 14, np.uint8):
            pass
    assert sorted(buf.nbytes for buf in ring.scratch_pool._spare["numpy"]) == [size << 14 for size in (6, 7, 8, 9)]


def test_public_surface():
    for name in ("broadcast", "reduce", "allreduce", "gather", "allgather", "scatter", "reduce_scatter",
                 "barrier"):
        assert callable(getattr(mpiring.Communicator, name)), name
        assert "ring" in ALGORITHMS[name]
    assert (mpiring.SUM, mpiring.PROD, mpiring.MIN, mpiring.MAX, mpiring.AVG) == ("sum", "prod", "min", "max", "avg")
    assert (mpiring.BAND, mpiring.BOR, mpiring.BXOR, mpiring.LAND, mpiring.LOR, mpiring.LXOR) == (
        "band", "bor", "bxor", "land", "lor", "lxor")
    for name in ("alltoall", "alltoallv", "scan", "exscan"):
        for method in (name, f"i{name}", f"{name}_init"):
            assert callable(getattr(mpiring.Communicator, method)), method
    assert issubclass(mpiring.ArgumentError, ValueError)


def test_info_command():
    result = subprocess.run([sys.executable, "-m", "mpiring", "info"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert f"mpiring {mpiring.__version__}" in result.stdout
    assert "MPI library:" in result.stdout and "world size: 1" in result.stdout
    assert "planned calls replay in" in result.stdout


def test_the_compiled_replay_is_built_wherever_it_can_be():
    """setup.py builds mpiring/engine/replay_c/ where a C compiler and Python's headers are (as
    here in CI); without them the install goes on and plans replay in Python. So where both
    are present, a missing extension is a broken install, not a choice."""
    import shutil
    import sysconfig

    from mpiring.engine import native

    compiler = shutil.which(os.environ.get("CC", "cc"))
    headers = pathlib.Path(sysconfig.get_paths()["include"], "Python.h").exists()
    assert native.available() or not (compiler and headers), "the C replay was not built: pip install -e . again"


def test_without_the_compiled_replay_the_hot_state_is_python_s_and_calls_run():
    """Where the C replay was not built (its import fails), a communicator's hot state, traffic and
    persistent requests' fields are mpiring.engine.state's Python classes, and every form of a
    call works on them."""
    program = (
        "import sys; sys.modules['mpiring.engine._replay'] = None\n"
        "import numpy as np, mpiring\n"
        "from mpiring.engine import native, state\n"
        "assert (native.HotState, native.Counters, native.RequestFields) == "
        "(state.HotState, state.Counters, state.RequestFields)\n"
        "comm = mpiring.Communicator(timeout=5.0)\n"
        "x, y = np.arange(4.0), np.empty(4)\n"
        "for _ in range(3): comm.allreduce(x, out=y)\n"
        "request = comm.allreduce_init(x, out=y)\n"
        "for _ in range(2): request.start(); request.wait()\n"
        "request.free(); comm.iallreduce(x, out=y).wait()\n"
        "hot = comm._ring.hot\n"
        "assert (hot.calls, hot.timeout, comm.timeout, hot.freed) == (7, 5.0, 5.0, False), hot.calls\n"
        "assert hot.served == hot.owner == comm._ring.owner and y.tolist() == x.tolist()\n"
        "assert comm.traffic is hot.traffic and comm.traffic == mpiring.Traffic()\n"
        "comm.free(); assert hot.freed and hot.served is None\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_version_option_and_license():
    for module, name in (("mpiring", "mpiring"), ("mpiring.bench", "mpiring-bench")):
        result = subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True, text=True,
                                timeout=60)
        assert result.returncode == 0 and result.stdout.strip() == f"{name} {mpiring.__version__}", result
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "LICENSE")) as handle:
        assert handle.readline().strip() == "MIT License"


def test_communicator_rejects_non_communicators():
    with pytest.raises(mpiring.ArgumentError, match="intracommunicator"):
        mpiring.Communicator(comm="COMM_WORLD")


def test_ranks_share_the_cores_among_blas_threads():
    from mpiring.launch import share_cores_among_local_ranks

    env = {"MPI_LOCALNRANKS": "4"}
    share_cores_among_local_ranks(env, cores=16)
    assert env["OPENBLAS_NUM_THREADS"] == env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "4"
    env = {"OMPI_COMM_WORLD_LOCAL_SIZE": "8", "OMP_NUM_THREADS": "3"}
    share_cores_among_local_ranks(env, cores=2)
    assert env["OPENBLAS_NUM_THREADS"] == "1" and env["OMP_NUM_THREADS"] == "3"  # at least 1; set ones kept
    env = {}
    share_cores_among_local_ranks(env, cores=2)
    assert env == {}  # no launcher: nothing changes


def test_running_out_of_communicators_says_to_free_them():
    """In a process of its own: making communicators until MPI has no context id left."""
    code = ("import mpiring\nfrom mpi4py import MPI\nmade = []\ntry:\n    while len(made) < 100000:\n"
            "        made.append(mpiring.Communicator(MPI.COMM_SELF))\nexcept mpiring.CommunicationError as e:\n"
            "    print('raised after', len(made), e)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "raised after" in result.stdout and "free() each one it no longer needs" in result.stdout, result.stdout


def test_the_catalogue_is_what_every_table_and_the_api_follow():
    import inspect

    from mpiring.algorithms import ALGORITHMS
    from mpiring.bench.table import COLLECTIVES
    from mpiring.catalogue import CATALOGUE
    from mpiring.selection import SWITCH_POINTS

    assert list(ALGORITHMS) == list(SWITCH_POINTS) == list(COLLECTIVES) == list(CATALOGUE)
    for name, entry in CATALOGUE.items():
        assert (COLLECTIVES[name].reduces, COLLECTIVES[name].rooted) == (entry.reduces, entry.rooted), name
        for method in (name, f"i{name}", f"{name}_init"):
            parameters = inspect.signature(getattr(mpiring.Communicator, method)).parameters
            assert ("op" in parameters, "root" in parameters) == (entry.reduces, entry.rooted), method
            takes_counts = (entry.joins_rows and not entry.send_counts) or name in ("scatter", "reduce_scatter")
            assert ("counts" in parameters) == takes_counts, method
            assert ("send_counts" in parameters) == ("recv_counts" in parameters) == entry.send_counts, method


def test_every_environment_variable_is_read_by_one_module_with_one_rule(monkeypatch):
    import pathlib
    import re

    from mpiring import environment
    from mpiring.errors import ArgumentError

    direct = re.compile(r"""environ(\.get\(|\[)\s*["']MPIRING_""")
    readers = [p.name for p in pathlib.Path(mpiring.__file__).parent.rglob("*.py") if direct.search(p.read_text())]
    assert readers == [], readers  # every MPIRING_* variable goes through mpiring.environment
    for word, value in (("1", True), ("Yes", True), ("off", False), ("0", False), ("", None)):
        monkeypatch.setenv("MPIRING_GPU_IPC", word)
        assert environment.flag("MPIRING_GPU_IPC", "test") is value
    monkeypatch.setenv("MPIRING_DEBUG", "maybe")
    with pytest.raises(ArgumentError, match="MPIRING_DEBUG"):
        environment.flag("MPIRING_DEBUG", "test")
    monkeypatch.setenv("MPIRING_TIMEOUT", "none")
    assert environment.seconds("MPIRING_TIMEOUT", "test") == float("inf")


def test_bfloat16_is_refused_on_a_device_backend():
    """CuPy has no bfloat16 arithmetic: a device array of it gets a clear error, not a wrong sum."""
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="pip install ml_dtypes (mpiring's bf16 extra)")
    from mpiring.validation import check_array

    class DeviceBackend:  # any backend but the host's; check_array only asks it for an array
        name = "cupy"

        def asarray(self, x):
            return x

    with pytest.raises(mpiring.ArgumentTypeError, match="host only"):
        check_array("allreduce", "x", np.ones(3, ml_dtypes.bfloat16), DeviceBackend())
    assert check_array("allreduce", "x", np.ones(3, ml_dtypes.bfloat16), NUMPY).dtype.name == "bfloat16"


# ---- the import graph: no circles, and no arrow from the core up to gpu/, training/ or bench/

_UPPER = ("mpiring.gpu", "mpiring.training", "mpiring.bench")
# Modules outside the core that may import the upper layers: the composition root, which
# registers the device backend, and the entry points that start training and `mpiring info`.
_ABOVE_THE_CORE = {"mpiring", "mpiring.train", "mpiring.cli"}


def _upper(module: str) -> bool:
    return any(module == layer or module.startswith(layer + ".") for layer in _UPPER)


def _import_graph() -> dict[str, set[str]]:
    """Every module under mpiring/ -> the mpiring modules it imports anywhere in its source
    (function-level and typing-only imports too). `from pkg import name` points at pkg.name
    when that is a module, else at pkg."""
    import ast
    import pathlib

    top = pathlib.Path(mpiring.__file__).parent
    paths = {}
    for path in top.rglob("*.py"):
        parts = path.relative_to(top.parent).with_suffix("").parts
        paths[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for module, path in paths.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                base = ".".join(base + ([node.module] if node.module else []))
                targets.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in paths else base
                               for alias in node.names)
        graph[module] = {target for target in targets if target in paths and target != module}
    return graph


def _a_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of `graph` (its modules, the first repeated at the end), or None."""
    done: set[str] = set()
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        if module in path:
            return path[path.index(module):] + [module]
        if module in done:
            return None
        path.append(module)
        for target in sorted(graph[module]):
            circle = visit(target)
            if circle:
                return circle
        path.pop()
        done.add(module)
        return None

    return next((circle for module in sorted(graph) if (circle := visit(module))), None)


def test_the_package_imports_without_circles_and_the_core_never_imports_upward():
    graph = _import_graph()
    # what the walk must see: `from pkg import module`, a function-level import, a typing-only one
    assert "mpiring.collectives" in graph["mpiring.communicator"]
    assert "mpiring.gpu" in graph["mpiring.cli"]
    assert "mpiring.backend" in graph["mpiring.engine.ring"]
    assert _a_circle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]

    assert _a_circle(graph) is None, " -> ".join(_a_circle(graph))
    upward = {module: sorted(filter(_upper, targets)) for module, targets in graph.items() if not _upper(module)}
    assert {module: targets for module, targets in upward.items()
            if targets and module not in _ABOVE_THE_CORE} == {}
    assert all(upward[module] for module in _ABOVE_THE_CORE), "an exemption no module needs any more"


def test_the_compiled_replay_takes_plain_copies_and_exact_arithmetic_and_calls_the_rest():
    """native.work_spec: what the C loop does itself, and what it leaves to NumPy."""
    from mpiring.engine import native

    a, b, out = np.ones(6, np.float32), np.ones(6, np.float32), np.zeros(6, np.float32)
    refs = ((1, 0), (0, 0), (0, 8))
    assert native.work_spec("copy", None, (out, a), refs[:2], 0) == (native.WORK_COPY, 0, 0, (1, 0), (0, 0),
                                                                       (-1, 0), 24, 0)
    assert native.work_spec("op", "sum", (out, a, b), refs, 0)[0] == native.WORK_OP
    assert native.work_spec("op", "sum", (out, out, b), refs, 0)[0] == native.WORK_OP  # in place: the same memory
    assert native.work_spec("op", "max", (out.astype(np.int32),) * 3, refs, 0)[0] == native.WORK_OP
    called = [("op", "max", (out, a, b)),  # float max: NaN and signed zeros are NumPy's
              ("op", "sum", (out[:5], out[1:], b[:5])),  # overlapping, shifted: NumPy buffers it
              ("copy", None, (out[::2], a[:3])),  # not contiguous
              ("op", "sum", (out, a.astype(np.float64), b))]  # mixed dtypes
    for kind, op, arrays in called:
        assert native.work_spec(kind, op, arrays, refs[:len(arrays)], 0) is None, (kind, op)


def test_nothing_but_mpiring_torch_imports_torch():
    """A foreign array through the core loads no array library: torch and JAX stay out unless the
    caller brought them (only mpiring.torch imports torch)."""
    code = ("import sys, numpy as np, mpiring\n"
            "c = mpiring.Communicator()\n"
            "class E:\n"
            "    def __init__(s, a): s.a = a\n"
            "    def __dlpack__(s, **k): return s.a.__dlpack__(**k)\n"
            "    def __dlpack_device__(s): return s.a.__dlpack_device__()\n"
            "assert (c.allreduce(E(np.ones(3))) == 1).all()\n"
            "import mpiring.bench, mpiring.interop, mpiring.train\n"
            "print(sorted(m for m in ('torch', 'jax', 'cupy') if m in sys.modules))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_every_algorithm_module_states_its_cost_and_draws_its_steps():
    """docs/adding-an-algorithm.md: a module's docstring gives the cost and a small diagram."""
    import inspect

    modules = {inspect.getmodule(function) for table in ALGORITHMS.values() for function in table.values()}
    for module in modules:
        doc = inspect.getdoc(module) or ""
        assert "cost" in doc.lower(), f"{module.__name__}: no cost in its docstring"
        assert any(line.startswith("    ") and line.strip() for line in doc.splitlines()), (
            f"{module.__name__}: no indented diagram in its docstring")


def test_python_m_mpiring_dropin_runs_a_program_unchanged(tmp_path):
    """A program written for mpi4py (it reads MPI.COMM_WORLD after start) runs on the drop-in."""
    program = tmp_path / "program.py"
    program.write_text(
        "import sys\n"
        "import numpy as np\n"
        "from mpi4py import MPI\n"
        "comm = MPI.COMM_WORLD\n"
        "x, y = np.ones(3), np.empty(3)\n"
        "comm.Allreduce(x, y)\n"
        "print(type(comm).__module__, y.tolist(), comm.served().traffic.messages, sys.argv[1:])\n"
    )
    result = subprocess.run([sys.executable, "-m", "mpiring.dropin", str(program), "a", "b"],
                            capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[0] == "mpiring.dropin", result.stdout
    assert "[1.0, 1.0, 1.0]" in result.stdout and "['a', 'b']" in result.stdout, result.stdout


def test_the_c_replay_looks_up_no_attribute_of_mpirings_objects_by_name():
    """What C reads of mpiring's Python side are C structs' fields (the hot state, a request's and a
    call's fields) and objects handed to it: the only names it looks up are NumPy's arrays' own."""
    sources = pathlib.Path(mpiring.__file__).parent / "engine" / "replay_c"
    text = "\n".join(path.read_text() for path in sorted(sources.glob("*.[ch]")))
    assert not re.search(r"PyMemberDescr|tp_dictoffset|_PyObject_GetDictPtr|GetAttrString|SetAttr", text)
    looked_up = re.findall(r"PyObject_(?:GetAttr|CallMethod\w*)\(\s*\w+\s*,\s*(\w+)", text)
    assert looked_up and set(looked_up) <= {"s_dtype", "s_shape", "s_view", "s_copy"}, looked_up
    interned = dict(re.findall(r"(s_\w+) = PyUnicode_InternFromString\(\"(\w+)\"\)", text))
    assert interned == {"s_shape": "shape", "s_dtype": "dtype", "s_view": "view", "s_copy": "copy"}
