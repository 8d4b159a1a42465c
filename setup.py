"""Metadata lives in setup.cfg; this adds the optional C replay of plans (mpiring/engine/_replay.c).

It needs a C compiler and Python's headers, and no MPI headers. Where it cannot be built the
install goes on without it, and plans replay in Python (mpiring.engine.native).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("mpiring.engine._replay", ["mpiring/engine/_replay.c"], optional=True)])
