"""The catalogue of collectives: each one's name and the facts other modules follow from it
(the consistency check's fingerprint fields, the benchmark's rows and options, the algorithm and
selection tables, the Communicator's methods; tests/test_package.py checks they all agree).

    name            reduces  rooted  joins rows  data known to every rank
    broadcast                yes                 yes
    reduce          yes      yes                 yes
    allreduce       yes                          yes
    gather                   yes     yes         yes (row counts may differ)
    allgather                        yes         yes (row counts may differ)
    scatter                  yes                 no: only the root holds x
    reduce_scatter  yes                          yes
    barrier                                      no data
    alltoall                                     yes
    alltoallv                        yes         yes (row counts may differ; send_counts=)
    scan            yes                          yes
    exscan          yes                          yes
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Entry:
    name: str
    reduces: bool = False  # takes op=
    rooted: bool = False  # takes root=
    joins_rows: bool = False  # joins the ranks' x along axis 0: only the row shape must agree
    has_data: bool = True  # every rank passes x (scatter: the root only; barrier: none)
    send_counts: bool = False  # takes send_counts and recv_counts (the all-to-all-v form)


CATALOGUE: dict[str, Entry] = {
    e.name: e
    for e in (
        Entry("broadcast", rooted=True),
        Entry("reduce", reduces=True, rooted=True),
        Entry("allreduce", reduces=True),
        Entry("gather", rooted=True, joins_rows=True),
        Entry("allgather", joins_rows=True),
        Entry("scatter", rooted=True, has_data=False),
        Entry("reduce_scatter", reduces=True),
        Entry("barrier", has_data=False),
        Entry("alltoall"),
        Entry("alltoallv", joins_rows=True, send_counts=True),
        Entry("scan", reduces=True),
        Entry("exscan", reduces=True),
    )
}

NAMES = tuple(CATALOGUE)
REDUCING = tuple(e.name for e in CATALOGUE.values() if e.reduces)
ROOTED = tuple(e.name for e in CATALOGUE.values() if e.rooted)
JOINING = tuple(e.name for e in CATALOGUE.values() if e.joins_rows)
WITHOUT_DATA = tuple(e.name for e in CATALOGUE.values() if not e.has_data)
# every rank passes an x of one shape: its size alone may decide a route every rank takes alike
SAME_SIZE_EVERYWHERE = frozenset(e.name for e in CATALOGUE.values() if e.has_data and not e.joins_rows)
