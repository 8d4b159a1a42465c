"""Run the C replay's tests with mpiring/engine/replay_c/ built under AddressSanitizer.

    python scripts/check_asan.py                    # the default tests at 2 and 3 ranks; CI runs it
    python scripts/check_asan.py --sizes 2 -- tests/test_shortcut.py -k persistent

Builds the extension, every C file setup.py lists, with `-fsanitize=address` into a copy of the
working tree (the checkout's own build is left alone), then runs tests/run_world_sizes.py from that copy with libasan
preloaded into every rank. Any heap overflow, use after free or double free in the C Shortcut,
the replay or the persistent requests stops the rank with ASan's report, and the run fails.
Leak checking is off: the Python interpreter and MPI keep memory until exit by design. Needs gcc
(or clang) with its libasan, Python's headers and an MPI from the wheels.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys
import sysconfig
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
# The tests that drive the C Shortcut, the replay, persistent requests and their refusals, and
# the C look at buffer specs.
DEFAULT_TESTS = ["tests/test_shortcut.py", "tests/test_tags.py", "tests/test_plans.py", "tests/test_binding.py",
                 "tests/test_threads.py", "tests/test_nonblocking.py", "tests/test_buffer_specs.py"]
FLAGS = "-fsanitize=address -fno-omit-frame-pointer -g -O1"


def libasan() -> str:
    """The path of the compiler's ASan runtime, to preload into Python (which is not built with it)."""
    compiler = sysconfig.get_config_var("CC").split()[0] if sysconfig.get_config_var("CC") else "gcc"
    path = subprocess.run([compiler, "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    if not os.path.isabs(path) or not os.path.exists(path):
        raise SystemExit(f"check_asan: {compiler} has no libasan.so (install the compiler's sanitizer runtime)")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 3], help="world sizes (default: 2 3)")
    parser.add_argument("pytest_args", nargs="*", help=f"after --: pytest arguments (default: {DEFAULT_TESTS})")
    args = parser.parse_args(argv)
    runtime = libasan()
    with tempfile.TemporaryDirectory(prefix="mpiring-asan-") as temporary:
        copy = pathlib.Path(temporary) / "mpiring"
        files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                               capture_output=True).stdout.decode().split("\0")
        for name in filter(None, files):
            if (ROOT / name).is_file():
                (copy / name).parent.mkdir(parents=True, exist_ok=True)
                (copy / name).write_bytes((ROOT / name).read_bytes())
        build = dict(os.environ, CFLAGS=FLAGS, LDFLAGS="-fsanitize=address")
        subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=copy, env=build, check=True)
        built = list((copy / "mpiring" / "engine").glob("_replay*.so"))
        if not built:
            raise SystemExit("check_asan: the extension did not build")
        check = subprocess.run(["nm", "-D", str(built[0])], capture_output=True, text=True).stdout
        if "__asan" not in check:
            raise SystemExit(f"check_asan: {built[0].name} is not instrumented")
        # ASan's reports go to files: pytest's output capture would swallow them with the aborted rank
        reports = pathlib.Path(temporary) / "reports"
        reports.mkdir()
        # this Python's bin first: the wheels' mpiexec lives next to it
        path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
        # PYTHONMALLOC=malloc: Python's own small-object allocator would hide overruns of PyMem blocks
        env = dict(os.environ, PATH=path, PYTHONPATH=str(copy), LD_PRELOAD=runtime, PYTHONMALLOC="malloc",
                   ASAN_OPTIONS=f"detect_leaks=0:abort_on_error=1:log_path={reports}/asan", MPIRING_COMPILED="1")
        probe = "import mpiring.engine.native as c, sys; sys.exit(0 if c.available() else 1)"
        if subprocess.run([sys.executable, "-c", probe], cwd=copy, env=env).returncode != 0:
            raise SystemExit("check_asan: the instrumented C replay does not load (its tests would only skip)")
        # their serial tests once (a singleton MPI), then the MPI ones at each size
        command = [sys.executable, "tests/run_world_sizes.py", "--sizes", *map(str, args.sizes),
                   "--", *(args.pytest_args or DEFAULT_TESTS), "-x", "-p", "no:cacheprovider"]
        print("+", " ".join(command), flush=True)
        code = subprocess.run(command, cwd=copy, env=env).returncode
        for report in sorted(reports.iterdir()):
            print(f"--- {report.name}\n{report.read_text()}", flush=True)
            code = code or 1
        return code


if __name__ == "__main__":
    sys.exit(main())
