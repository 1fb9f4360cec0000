"""The free ranges the in-kernel unwinder's rows are handed out from
(capture/row_space.py): what is taken never overlaps what is held, what is
given back merges with its neighbours, the best fitting hole is used."""
from __future__ import annotations

import random

import pytest

from ustack.capture.row_space import RowSpace


def test_taking_from_an_empty_space_packs_from_the_start():
    space = RowSpace(100)
    assert [space.take(n) for n in (10, 20, 30)] == [0, 10, 30]
    assert space.used == 60 and space.free == 40 and space.largest == 40
    assert space.take(41) is None
    assert space.take(40) == 60
    assert space.take(1) is None and space.free == 0


def test_given_back_ranges_merge_with_both_neighbours():
    space = RowSpace(100)
    a, b, c = space.take(10), space.take(10), space.take(10)
    space.give_back(a, 10)
    space.give_back(c, 10)             # merges with the tail: [20, 100)
    assert space.ranges() == [(0, 10), (20, 100)]
    space.give_back(b, 10)             # joins both: one range again
    assert space.ranges() == [(0, 100)]
    assert space.take(100) == 0


def test_the_smallest_hole_that_fits_is_used():
    space = RowSpace(100)
    held = [space.take(10) for _ in range(10)]
    space.give_back(held[1], 10)                     # a hole of 10
    space.give_back(held[5], 10)
    space.give_back(held[6], 10)                     # a hole of 20
    assert space.take(15) == held[5]                 # only the 20 holds 15
    assert space.take(10) == held[1]                 # the 10 fits exactly
    assert space.ranges() == [(65, 70)]


def test_a_range_free_already_or_outside_is_refused():
    space = RowSpace(50)
    first = space.take(20)
    space.give_back(first, 20)
    with pytest.raises(ValueError):
        space.give_back(first, 20)
    space.take(50)
    with pytest.raises(ValueError):
        space.give_back(40, 20)
    space.give_back(10, 5)
    with pytest.raises(ValueError):
        space.give_back(8, 4)                        # overlaps the free [10, 15)


def test_the_room_one_range_would_make_counts_its_free_neighbours():
    space = RowSpace(100)
    a, b, c = space.take(10), space.take(10), space.take(10)    # [30, 100) free
    assert space.run_if_given_back(c, 10) == 80                 # with the tail
    assert space.run_if_given_back(b, 10) == 10                 # held on both sides
    space.give_back(a, 10)
    assert space.run_if_given_back(b, 10) == 20                 # with the hole before
    assert space.ranges() == [(0, 10), (30, 100)]               # nothing given back


def test_a_copy_is_a_plan_that_leaves_the_space_alone():
    space = RowSpace(30)
    a = space.take(10)
    space.take(20)
    trial = space.copy()
    trial.give_back(a, 10)
    assert trial.fits(10) and not space.fits(10)
    assert space.ranges() == []


def test_random_takes_and_gives_never_overlap():
    rng = random.Random(35)
    space = RowSpace(10_000)
    held: dict = {}
    for _ in range(5_000):
        if held and rng.random() < 0.45:
            start = rng.choice(list(held))
            space.give_back(start, held.pop(start))
        else:
            n = rng.randint(1, 700)
            start = space.take(n)
            if start is None:
                assert space.largest < n
                continue
            held[start] = n
        spans = sorted((s, s + n) for s, n in held.items())
        assert all(e <= s2 for (_s, e), (s2, _e) in zip(spans, spans[1:]))
        assert all(0 <= s and e <= space.capacity for s, e in spans)
        assert space.used == sum(held.values())
        free = space.ranges()
        # free ranges are merged: no two touch, none meets a held range
        assert all(e < s2 for (_s, e), (s2, _e) in zip(free, free[1:]))
        for s, e in free:
            assert not any(hs < e and s < he for hs, he in spans)


def test_growing_adds_free_slots_at_the_end_joined_to_a_free_tail():
    space = RowSpace(10)
    space.take(6)
    assert space.tail == 4
    space.grow(8)                      # the tail's 4 and the 8 new: one range
    assert space.capacity == 18 and space.ranges() == [(6, 18)] and space.take(12) == 6
    assert space.tail == 0
    space.grow(5)                      # nothing free at the end: a range of its own
    assert space.ranges() == [(18, 23)] and space.tail == 5
    space.give_back(0, 6)
    assert space.ranges() == [(0, 6), (18, 23)] and space.used == 12
    with pytest.raises(ValueError):
        space.give_back(20, 1)         # free already, grown or not
