"""The line merge used to re-base a variant: adjacent changes combine, overlapping ones don't."""

from __future__ import annotations

from gpuswarm.research.variants import merge_lines

BASE = b"LR = 0.04\nDEPTH = 8\nWD = 0.1\n"


def test_changes_to_adjacent_lines_combine() -> None:
    ours = b"LR = 0.05\nDEPTH = 8\nWD = 0.1\n"
    theirs = b"LR = 0.04\nDEPTH = 6\nWD = 0.1\n"
    assert merge_lines(BASE, ours, theirs) == b"LR = 0.05\nDEPTH = 6\nWD = 0.1\n"


def test_changes_to_the_same_line_conflict() -> None:
    ours = b"LR = 0.05\nDEPTH = 8\nWD = 0.1\n"
    theirs = b"LR = 0.045\nDEPTH = 8\nWD = 0.1\n"
    assert merge_lines(BASE, ours, theirs) is None


def test_the_same_change_on_both_sides_is_taken_once() -> None:
    ours = theirs = b"LR = 0.05\nDEPTH = 8\nWD = 0.1\n"
    assert merge_lines(BASE, ours, theirs) == ours


def test_insertions_at_one_place_conflict_but_apart_combine() -> None:
    ours = b"LR = 0.04\nX = 1\nDEPTH = 8\nWD = 0.1\n"
    theirs = b"LR = 0.04\nY = 2\nDEPTH = 8\nWD = 0.1\n"
    assert merge_lines(BASE, ours, theirs) is None
    theirs_end = BASE + b"Y = 2\n"
    assert merge_lines(BASE, ours, theirs_end) == b"LR = 0.04\nX = 1\nDEPTH = 8\nWD = 0.1\nY = 2\n"


def test_an_insertion_inside_a_replaced_block_conflicts() -> None:
    ours = b"LR = 0.04\nZ = 0\nWD = 0.1\n"  # DEPTH line replaced
    theirs = b"LR = 0.04\nDEPTH = 8\nNEW = 1\nWD = 0.1\n"  # insertion after DEPTH: adjacent, ok
    assert merge_lines(BASE, ours, theirs) == b"LR = 0.04\nZ = 0\nNEW = 1\nWD = 0.1\n"
    ours_two = b"LR = 0.5\nZ = 0\nWD = 0.1\n"  # LR and DEPTH replaced as one block
    theirs_mid = b"LR = 0.04\nMID = 1\nDEPTH = 8\nWD = 0.1\n"  # insertion between them
    assert merge_lines(BASE, ours_two, theirs_mid) is None


def test_deletions_and_edits_elsewhere_combine() -> None:
    ours = b"DEPTH = 8\nWD = 0.1\n"  # LR line deleted
    theirs = b"LR = 0.04\nDEPTH = 8\nWD = 0.2\n"
    assert merge_lines(BASE, ours, theirs) == b"DEPTH = 8\nWD = 0.2\n"
