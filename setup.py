"""Metadata lives in setup.cfg; this adds the optional C replay of plans (mpiring/engine/replay_c/).

It needs a C compiler and Python's headers, and no MPI headers. Where it cannot be built the
install goes on without it, and plans replay in Python (mpiring.engine.native). Its files, one
role each (replay_c/replay.h names them), compile into the one extension mpiring.engine._replay.
"""

from setuptools import Extension, setup

REPLAY = "mpiring/engine/replay_c/"
SOURCES = ["module.c", "mpi.c", "hot_state.c", "work.c", "program.c", "run.c", "arrays.c", "specs.c",
           "dropin.c", "shortcut.c", "persistent.c"]

setup(ext_modules=[Extension("mpiring.engine._replay", [REPLAY + name for name in SOURCES],
                             depends=[REPLAY + "replay.h"], optional=True)])
