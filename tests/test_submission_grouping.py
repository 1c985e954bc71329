"""Which ready jobs share a submission (``waypost.scheduler.grouping``),
the same for every scheduler: jobs alone first, then packs cut into arrays
of their class's size, then bundles; jobs of another rule or request never
share one; a group of one goes alone; a scheduler without arrays submits
packed jobs one each, and still bundles."""

from __future__ import annotations

from waypost.scheduler import SCHEDULERS, grouping
from waypost.scheduler.grouping import ARRAY, BUNDLE, SINGLE, Ask, plan


def shapes(submissions):
    return [(s.kind, s.jobs) for s in submissions]


def test_packs_are_cut_to_their_size_and_a_remainder_of_one_goes_alone():
    asks = [Ask("plain", None), *(Ask(f"a{i}", ("align", "mem=1G"), pack=3) for i in range(7))]
    assert shapes(plan(asks, arrays=True)) == [
        (SINGLE, ["plain"]), (ARRAY, ["a0", "a1", "a2"]), (ARRAY, ["a3", "a4", "a5"]), (SINGLE, ["a6"])]


def test_only_jobs_of_one_rule_and_request_share_a_submission():
    asks = [Ask("x1", ("align", "mem=1G"), pack=4), Ask("y1", ("align", "mem=2G"), pack=4),
            Ask("x2", ("align", "mem=1G"), pack=4), Ask("z1", ("sort", "mem=1G"), bundle=4),
            Ask("y2", ("align", "mem=2G"), pack=4), Ask("z2", ("sort", "mem=1G"), bundle=4)]
    assert shapes(plan(asks, arrays=True)) == [
        (ARRAY, ["x1", "x2"]), (ARRAY, ["y1", "y2"]), (BUNDLE, ["z1", "z2"])]


def test_a_bundle_wins_over_a_pack_and_takes_the_larger_size():
    asks = [Ask(f"s{i}", ("sort", ""), pack=3, bundle=2) for i in range(4)]
    assert shapes(plan(asks, arrays=True)) == [(BUNDLE, ["s0", "s1", "s2"]), (SINGLE, ["s3"])]


def test_without_arrays_packed_jobs_go_one_each_and_bundles_stay():
    asks = [Ask("a1", ("align", ""), pack=2), Ask("b1", ("sort", ""), bundle=2),
            Ask("a2", ("align", ""), pack=2), Ask("b2", ("sort", ""), bundle=2)]
    assert shapes(plan(asks, arrays=False)) == [(SINGLE, ["a1"]), (SINGLE, ["a2"]), (BUNDLE, ["b1", "b2"])]


def test_slurm_says_it_has_arrays():
    assert {s.name: s.arrays for s in SCHEDULERS}["slurm"] is True
    assert grouping.plan([], arrays=True) == []
