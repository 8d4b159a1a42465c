"""Build mpiring's sdist and wheel, install the wheel into a fresh venv and import it there.

    python scripts/check_wheel.py            # about a minute; CI runs it (.ci/run)
    python scripts/check_wheel.py --keep DIR # keep the sdist, the wheel and the venv in DIR

Checks that `python -m build` makes both from a clean copy of the tracked files, that the sdist
carries every file of the C replay's sources (mpiring/engine/replay_c/), that the wheel carries
the C replay (those files compiled into mpiring.engine._replay: the wheel is platform-specific), that
it installs with its dependencies into a venv of its own, and that there `import mpiring` gives
the checkout's version and `mpiring.engine.native.available()` is True. Needs the `build`
package (the `docs` extra), a C compiler and Python's headers.
"""

from __future__ import annotations

import argparse
import pathlib
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
REPLAY_C = "mpiring/engine/replay_c"  # the C replay's sources


def run(command: list[str], **kwargs) -> None:
    print("+", " ".join(command), flush=True)
    subprocess.run(command, check=True, **kwargs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", metavar="DIR", help="build in DIR and keep it (default: a temporary directory)")
    args = parser.parse_args(argv)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mpiring-wheel-") as temporary:
        work = pathlib.Path(args.keep or temporary)
        work.mkdir(parents=True, exist_ok=True)
        source, dist, venv = work / "source", work / "dist", work / "venv"
        # a clean copy of what git tracks: no build/, .venv or compiled extension in place
        source.mkdir(exist_ok=True)
        archive = subprocess.run(["git", "archive", "HEAD"], cwd=ROOT, check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(source)], input=archive, check=True)
        for path in ("setup.py", "setup.cfg", "pyproject.toml", "MANIFEST.in", "README.md", "LICENSE", "mpiring"):
            # the working tree's version of the packaging files and the package, committed or not
            subprocess.run(["cp", "-r", str(ROOT / path), str(source / pathlib.Path(path).parent)], check=True)
        run([sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", str(dist), str(source)])
        wheels, sdists = sorted(dist.glob("mpiring-*.whl")), sorted(dist.glob("mpiring-*.tar.gz"))
        if len(wheels) != 1 or len(sdists) != 1:
            raise SystemExit(f"check_wheel: expected one wheel and one sdist in {dist}, found {wheels + sdists}")
        # the C replay's sources in the sdist (a wheel built from it without its header would only
        # lack the extension, setup.py's extension being optional)
        c_sources = {path.relative_to(source).as_posix() for path in (source / REPLAY_C).iterdir()
                     if path.suffix in (".c", ".h")}
        with tarfile.open(sdists[0]) as sdist:
            carried = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
        if not c_sources or not c_sources <= carried:
            missing = sorted(c_sources - carried) or f"{REPLAY_C}/*.c"
            raise SystemExit(f"check_wheel: {sdists[0].name} lacks {missing} (MANIFEST.in, setup.py)")
        names = zipfile.ZipFile(wheels[0]).namelist()
        if not any(name.startswith("mpiring/engine/_replay") and name.endswith(".so") for name in names):
            raise SystemExit(f"check_wheel: {wheels[0].name} has no compiled mpiring/engine/_replay (no C compiler?)")
        run([sys.executable, "-m", "venv", str(venv)])
        python = str(venv / "bin" / "python")
        run([python, "-m", "pip", "install", "-q", f"{wheels[0]}[mpich]"])  # an MPI to load, from PyPI
        from mpiring import __version__

        check = ("import mpiring, mpiring.engine.native as c; "
                 f"assert mpiring.__version__ == {__version__!r}, mpiring.__version__; "
                 "assert c.available(), 'the C replay is not available'; "
                 "assert '/venv/' in mpiring.__file__, mpiring.__file__; "
                 "print('mpiring', mpiring.__version__, 'from', mpiring.__file__, '- C replay available')")
        run([python, "-c", check], cwd=work)
        print(f"check_wheel: {wheels[0].name} and {sdists[0].name} OK in {time.monotonic() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
