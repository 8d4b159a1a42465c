"""The notice board (mpiring.engine.notice_board): the calls each rank left, in memory the ranks
of one node share, where a completed call looks for a peer that left it."""

from __future__ import annotations

import mmap

import numpy as np
import pytest
from mpi4py import MPI

from mpiring.engine import notice_board
from mpiring.engine.notice_board import SLOTS, NoticeBoard, key


def board_of(ranks: int, rank: int, memory: mmap.mmap | None = None) -> NoticeBoard:
    memory = memory or mmap.mmap(-1, mmap.PAGESIZE)
    memory[: ranks * SLOTS * 8] = np.full(ranks * SLOTS, -1, np.int64).tobytes()
    return NoticeBoard(memory, ranks, rank)


def test_a_posted_call_is_found_in_its_rank_row_by_every_other_rank():
    memory = mmap.mmap(-1, mmap.PAGESIZE)
    boards = [board_of(3, 0, memory), NoticeBoard(memory, 3, 1), NoticeBoard(memory, 3, 2)]
    assert all(b.who_left(77, 5) == -1 for b in boards)
    boards[2].post(77, 5)
    assert boards[0].who_left(77, 5) == 2 and boards[1].who_left(77, 5) == 2
    assert boards[2].who_left(77, 5) == -1  # its own row is not a peer's notice
    assert boards[0].who_left(77, 6) == -1 and boards[0].who_left(78, 5) == -1  # another call, another tag


def test_the_key_tells_calls_apart_that_share_a_tag():
    """A tag carries only the low bits of the call's number: the key carries the number too."""
    board = board_of(2, 0)
    NoticeBoard(board._memory, 2, 1).post(9, 3)
    assert board.who_left(9, 3) == 1
    assert board.who_left(9, 3 + 256) == -1


def test_a_board_no_rank_posted_on_is_not_searched():
    """`posted` says whether any rank posted: a key written without it is not looked for."""
    board = board_of(2, 0)
    board.rows[1, 5] = key(5, 7)
    assert board.who_left(5, 7) == -1
    NoticeBoard(board._memory, 2, 1).post(6, 7)  # (in slot 0)
    assert board.who_left(5, 7) == 1


def test_a_row_keeps_the_last_slots_calls():
    memory = mmap.mmap(-1, mmap.PAGESIZE)
    reader, writer = board_of(2, 0, memory), NoticeBoard(memory, 2, 1)
    for number in range(SLOTS + 2):
        writer.post(40, number)
    assert [reader.who_left(40, n) for n in range(SLOTS + 2)] == [-1, -1] + [1] * SLOTS


def test_bytes_of_a_key_across_two_slots_are_no_match():
    """A search for the key's bytes may land inside two neighbouring keys: only a whole slot counts."""
    board = board_of(2, 0)
    wanted = key(5, 7).to_bytes(8, "little", signed=True)
    both = (b"\xff" * 4 + wanted[:4], wanted[4:] + b"\xff" * 4)
    NoticeBoard(board._memory, 2, 1).post(6, 7)  # (some post: the rows are searched)
    board.rows[1, 0], board.rows[1, 1] = (int.from_bytes(half, "little", signed=True) for half in both)
    assert board.who_left(5, 7) == -1
    board.rows[1, 5] = key(5, 7)
    assert board.who_left(5, 7) == 1


@pytest.mark.mpi
def test_every_rank_of_one_node_opens_the_same_board_and_sees_the_others_posts():
    world = MPI.COMM_WORLD
    board = notice_board.open_board(world)
    assert board is not None and board.rows.shape == (world.size, SLOTS)
    board.post(1000 + world.rank, 1)
    world.Barrier()  # (a post is a store in shared memory: it is there once the poster passed the barrier)
    for peer in range(world.size):
        assert board.who_left(1000 + peer, 1) == (-1 if peer == world.rank else peer)
    world.Barrier()
