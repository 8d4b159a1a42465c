"""Message tags and call identities (mpiring.engine.tags, mpiring.identity), without MPI: every
field of a call that changes its identity changes its tag, and the words name what it was."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from mpiring import identity
from mpiring.algorithms import ALGORITHMS
from mpiring.backend import SUPPORTED_DTYPES
from mpiring.catalogue import NAMES, REDUCING, ROOTED, WITHOUT_DATA
from mpiring.engine.tags import Tags, number_field
from mpiring.ops import OPS, op_problem

MPICH, OPEN_MPI = 2**29 - 1, 2**31 - 1


def _calls():
    """Every (collective, dtype, op, root, algorithm) a blocking call can have, roots 0..7."""
    for collective in NAMES:
        dtypes = [None] if collective in WITHOUT_DATA else sorted(SUPPORTED_DTYPES, key=str)
        for dtype in dtypes:
            ops = [op for op in OPS if op_problem(op, dtype.kind) is None] if collective in REDUCING else [None]
            for op, root, algorithm in itertools.product(ops, range(8) if collective in ROOTED else [None],
                                                         ALGORITHMS[collective]):
                yield collective, dtype, op, root, algorithm


def _identity(collective, dtype, op, root, algorithm, layout_round=False):
    x = None if dtype is None else np.empty(0, dtype)
    return identity.of_call(collective, x, op, root, layout_round) | identity.of_algorithm(collective, algorithm)


def test_every_distinct_call_has_its_own_identity_and_is_named_by_it():
    seen = {}
    for call in _calls():
        bits = _identity(*call)
        assert bits not in seen, f"{call} and {seen[bits]} share identity {bits:#x}"
        seen[bits] = call
        collective, dtype, op, root, algorithm = call
        words = identity.describe(bits, size=4)
        assert words.startswith(f"{collective} ") or words == collective
        for part in (dtype and str(dtype), op and f"op {op}", root is not None and f"root {root}",
                     f"algorithm {algorithm}"):
            assert not part or part in words, (call, words)
    assert max(seen) < 1 << 20


def test_a_layout_round_leaves_the_dtype_to_the_layout_comparison():
    float32, float64 = (identity.of_call("allgather", np.empty(0, d), None, None, True) for d in ("f4", "f8"))
    assert float32 == float64 and float32 & 1
    assert identity.describe(float32, 4) == "allgather (layout round first)"
    assert identity.of_call("allgather", np.empty(0, "f4"), None, None, False) != float32


def test_roots_are_told_apart_mod_8_and_say_so_beyond_8_ranks():
    bits = _identity("broadcast", np.dtype("f8"), None, 11, "ring")
    assert bits == _identity("broadcast", np.dtype("f8"), None, 3, "ring")
    assert "root 3 mod 8" in identity.describe(bits, size=16) and "mod 8" not in identity.describe(bits, size=8)


@pytest.mark.parametrize("tag_ub", [MPICH, OPEN_MPI])
def test_blocking_tags_keep_generation_and_identity_apart(tag_ub):
    tags = Tags(tag_ub)
    assert tags.identity_bits == 20
    for generation, bits, calls in ((0, 0, 0), (1, 0x8F3A1, 9), (127, (1 << 20) - 1, 7), (1000, 5, 123)):
        tag = tags.blocking(generation, bits, calls)
        assert tags.is_blocking(tag) and tag + tags.ack_offset <= tag_ub
        assert tags.split(tag) == (generation % tags._generations, calls % 8, bits)
    assert tags._generations >= 16
    chosen = tags.with_identity(tags.blocking(3, 0x10000, 5), identity.of_algorithm("allreduce", "ring"))
    assert tags.split(chosen) == (3, 5, 0x10000 | identity.of_algorithm("allreduce", "ring"))
    sequence = tags.sequence(7)
    assert tags.with_identity(sequence, 0x70) == sequence and not tags.is_blocking(sequence)
    assert not tags.is_blocking(tags.persistent(7)) and not tags.is_blocking(tags.blocking(0, 0) + tags.ack_offset)


def test_notices_carry_the_failure_count_beyond_the_generations():
    tags = Tags(MPICH)
    first, wrapped = tags.notice(5), tags.notice(5 + tags._generations)  # the same generation
    assert tags.is_notice(first) and tags.is_notice(wrapped) and first != wrapped
    assert tags.split(first)[0] == tags.split(wrapped)[0]
    assert not tags.is_notice(tags.blocking(5, 0xB0000)) and not tags.is_notice(tags.sequence(5))
    assert identity.describe(tags.split(first)[2], 4) == "a notice that its blocking call raised there"
    assert Tags(None).notice(5) is None  # no room for identities: no notices


@pytest.mark.parametrize("tag_ub", [MPICH, OPEN_MPI])
def test_consecutive_blocking_calls_never_share_a_tag(tag_ub):
    """A blocking call's number (mod 8) is in its tag: a rank that skips or repeats a call waits
    for messages its peers never send instead of taking another call's; a recorded call's tag
    takes each call's number (with_sequence, and the C replay from `numbering`)."""
    tags = Tags(tag_ub)
    bits = _identity("allreduce", np.dtype("f4"), "sum", None, "ring")
    calls = [tags.blocking(2, bits, n) for n in range(20)]
    assert all(calls[n] != calls[n + 1] for n in range(19)) and calls[0] == calls[8]
    assert all(tags.with_sequence(calls[3], n) == calls[n] for n in range(20))
    base, shift, mask = tags.numbering(calls[0])
    first, field_mask, field_shift = number_field((base, shift, mask), calls[3])
    for n in range(20):  # what replay_c/run.c's number_call does, and Schedule.bind by number_field
        offset = calls[3] - base
        assert base + ((offset & ~(mask << shift)) | (n & mask) << shift) == calls[n]
        assert first + ((n & field_mask) << field_shift) == calls[n]
    assert number_field((base, shift, mask), base - 1) == (base - 1, 0, 0)  # below the base: no number
    assert number_field((base, shift, 0), calls[3]) == (calls[3], 0, 0)  # no mask: no number
    assert tags.numbering(tags.persistent(3)) == (0, 0, 0) and tags.with_sequence(tags.persistent(3), 5) == \
        tags.persistent(3)
    assert tags.blocking(2, bits) == calls[0]  # a device call's tag: number 0, for a plan's life


@pytest.mark.parametrize("tag_ub", [MPICH, OPEN_MPI])
def test_nonblocking_tags_name_their_kind(tag_ub):
    tags = Tags(tag_ub)
    f32 = identity.of_call("allreduce", np.empty(0, "f4"), "sum", None, False)
    f64 = identity.of_call("allreduce", np.empty(0, "f8"), "sum", None, False)
    maximum = identity.of_call("allreduce", np.empty(0, "f4"), "max", None, False)
    same_place = {tags.sequence(41, bits) for bits in (f32, f64, maximum)}
    assert len(same_place) == 3 and all(1 <= tag < tags.persistent(0) for tag in same_place)
    assert {tags.sequence_of(tag)[0] for tag in same_place} == {41}
    assert tags.sequence(41, f32) != tags.sequence(42, f32)
    assert tags.sequence(41, f32) == tags.sequence(41, f32 | 0x7F)  # the algorithm and root are not its kind
    small = Tags(None)  # no room: the sequence number alone
    assert small.sequence(41, f32) == small.sequence(41, f64) and small.sequence_of(small.sequence(41)) is None


@pytest.mark.parametrize("tag_ub", [MPICH, OPEN_MPI])
def test_persistent_tags_name_their_kind(tag_ub):
    tags = Tags(tag_ub)
    f32 = identity.of_call("allreduce", np.empty(0, "f4"), "sum", None, False)
    f64 = identity.of_call("allreduce", np.empty(0, "f8"), "sum", None, False)
    made = {tags.persistent(7, bits) for bits in (f32, f64)}
    assert len(made) == 2 and all(tags.persistent(0) <= tag < tags.blocking(0, 0) for tag in made)
    places = {tags.sequence_of(tag)[0] for tag in made}
    assert len(places) == 1 and places != {tags.sequence_of(tags.sequence(7, f32))[0]}  # not a nonblocking call's
    assert tags.persistent(7, f32) != tags.persistent(8, f32)
    scatter = identity.of_call("scatter", np.empty((0, 2), "f8"), None, 0, False)
    assert scatter != identity.of_call("scatter", np.empty((0, 2), "i8"), None, 0, False)  # counts=: dtype named
