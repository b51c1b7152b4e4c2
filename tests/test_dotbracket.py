"""Tests for layers.dotbracket: parsing, writing, validation, maximum nested subset."""

import itertools

import numpy as np
import pytest

from foldax.layers.dotbracket import (
    BRACKETS,
    StructureError,
    count_short_hairpins,
    find_crossing,
    from_dot_bracket,
    is_nested,
    max_nested_subset,
    pairs_from_table,
    table_from_pairs,
    to_dot_bracket,
    validate_pair_table,
)


def random_matching(rng, n, num_pairs):
    """A random pair table with ``num_pairs`` pairs (crossing allowed)."""
    positions = rng.permutation(n)[: 2 * num_pairs]
    return table_from_pairs(zip(positions[::2], positions[1::2]), n)


# ------------------------------------------------------------------ dot-bracket


@pytest.mark.parametrize("s", ["", "....", "(...)", "((..)).(...)", "(((...)))..((...))"])
def test_nested_round_trip(s):
    pt = from_dot_bracket(s)
    assert pt.dtype == np.int32 and len(pt) == len(s)
    assert to_dot_bracket(pt) == s
    validate_pair_table(pt)


@pytest.mark.parametrize("s", ["([)]", "((..[[..))..]]", "(<[)]>", "(.{A.)a}..", "([{<)]}>"])
def test_pseudoknot_round_trip(s):
    pt = from_dot_bracket(s, allow_pseudoknots=True)
    assert not is_nested(pt)
    back = to_dot_bracket(pt, allow_pseudoknots=True)
    assert np.array_equal(from_dot_bracket(back, allow_pseudoknots=True), pt)
    # the () page is a maximum nested subset
    first_page = from_dot_bracket("".join(c if c in "()." else "." for c in back))
    assert np.array_equal(first_page, max_nested_subset(pt))


def test_letter_brackets_and_symmetry():
    pt = from_dot_bracket("A(a)", allow_pseudoknots=True)
    assert pt.tolist() == [2, 3, 0, 1]
    assert BRACKETS[4] == ("A", "a")


@pytest.mark.parametrize(
    "s, position, reason, fragment",
    [
        ("(()", 0, "unbalanced", "unmatched '(' at position 0 (never closed)"),
        ("(.))", 3, "unbalanced", "unmatched ')' at position 3"),
        (")(", 0, "unbalanced", "unmatched ')' at position 0"),
        ("((.-))", 3, "bad_character", "unexpected character '-' at position 3"),
        ("((.x))", 3, "pseudoknot_bracket", "pseudoknot bracket 'x' at position 3"),
        ("((.[))]", 3, "pseudoknot_bracket", "pseudoknot bracket '[' at position 3"),
        ("(.).A", 4, "pseudoknot_bracket", "position 4"),
    ],
)
def test_from_dot_bracket_errors(s, position, reason, fragment):
    with pytest.raises(StructureError) as info:
        from_dot_bracket(s)
    assert isinstance(info.value, ValueError)
    assert info.value.position == position and info.value.reason == reason
    assert fragment in str(info.value)


def test_unbalanced_pseudoknot_brackets():
    with pytest.raises(StructureError, match=r"unmatched '\]' at position 5"):
        from_dot_bracket("([)].]", allow_pseudoknots=True)
    with pytest.raises(StructureError, match=r"unmatched '\[' at position 1 \(never closed\)"):
        from_dot_bracket("([)", allow_pseudoknots=True)


def test_to_dot_bracket_rejects_pseudoknot_by_default():
    with pytest.raises(StructureError, match=r"crossing pairs \(0, 2\) and \(1, 3\)"):
        to_dot_bracket([2, 3, 0, 1])


def test_to_dot_bracket_many_pages():
    # pairwise crossing pairs (i, i + k): k pages needed
    k = 6
    pt = table_from_pairs([(i, i + k) for i in range(k)], 2 * k)
    s = to_dot_bracket(pt, allow_pseudoknots=True)
    assert len(set(s)) == 2 * k
    assert np.array_equal(from_dot_bracket(s, allow_pseudoknots=True), pt)


# ------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "pt, reason, fragment",
    [
        ([1, 5], "out_of_range", "position 1 has partner 5, out of range [-1, 2)"),
        ([-2, -1], "out_of_range", "position 0 has partner -2"),
        ([-1, 1], "self_pair", "position 1 is paired with itself"),
        ([2, -1, 1], "asymmetric", "position 0 pairs with 2 but position 2 pairs with 1"),
        ([2, -1, -1], "asymmetric", "position 0 pairs with 2 but position 2 pairs with -1"),
        ([4, 5, -1, -1, 0, 1], "crossing", "crossing pairs (0, 4) and (1, 5)"),
        ([[1, 0]], "shape", "1-D"),
        ([0.5, 1.0], "shape", "integers"),
    ],
)
def test_validate_errors(pt, reason, fragment):
    with pytest.raises(StructureError) as info:
        validate_pair_table(pt)
    assert info.value.reason == reason
    assert fragment in str(info.value)


def test_validate_crossing_allowed_when_not_nested():
    assert validate_pair_table([2, 3, 0, 1], nested=False).tolist() == [2, 3, 0, 1]


def test_validate_min_hairpin():
    pt = from_dot_bracket("((...))")
    validate_pair_table(pt, min_hairpin=3)
    with pytest.raises(StructureError, match=r"pair \(1, 5\) encloses 3 unpaired positions, fewer than min_hairpin=4"):
        validate_pair_table(pt, min_hairpin=4)
    assert count_short_hairpins(pt, 3) == 0 and count_short_hairpins(pt, 4) == 1
    assert count_short_hairpins(from_dot_bracket("(())"), 3) == 2


def test_validate_returns_int32_copy_semantics():
    out = validate_pair_table(np.array([1, 0], dtype=np.int64))
    assert out.dtype == np.int32


def test_find_crossing_and_is_nested():
    assert find_crossing(from_dot_bracket("((..))")) is None
    assert find_crossing(from_dot_bracket("(.[.).]", allow_pseudoknots=True)) == ((0, 4), (2, 6))
    assert is_nested(np.full(5, -1))
    assert not is_nested(from_dot_bracket("([)]", allow_pseudoknots=True))


# --------------------------------------------------------- maximum nested subset


def brute_force_max_nested(pt):
    pairs = pairs_from_table(pt)
    for size in range(len(pairs), -1, -1):
        for subset in itertools.combinations(pairs, size):
            if is_nested(table_from_pairs(subset, len(pt))):
                return size
    return 0


def test_max_nested_subset_is_maximum():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(2, 14))
        pt = random_matching(rng, n, int(rng.integers(0, n // 2 + 1)))
        sub = max_nested_subset(pt)
        assert is_nested(sub)
        assert set(pairs_from_table(sub)) <= set(pairs_from_table(pt))
        assert len(pairs_from_table(sub)) == brute_force_max_nested(pt)


def test_max_nested_subset_tie_breaking_prefers_left():
    # (0,2) and (1,3) cross; both singletons are optimal: the left-most 5' end wins
    assert pairs_from_table(max_nested_subset([2, 3, 0, 1])) == [(0, 2)]
    # [[ ]] vs (( )): two pairs each, the pair starting first decides
    pt = from_dot_bracket("[[((]]))", allow_pseudoknots=True)
    assert to_dot_bracket(max_nested_subset(pt)) == "((..)).."
    assert pairs_from_table(max_nested_subset(pt)) == [(0, 5), (1, 4)]


def test_max_nested_subset_nested_input_unchanged():
    pt = from_dot_bracket("((..)).(...)")
    out = max_nested_subset(pt)
    assert np.array_equal(out, pt) and out is not pt


def test_max_nested_subset_large_is_fast():
    rng = np.random.default_rng(1)
    pt = random_matching(rng, 3000, 1400)
    sub = max_nested_subset(pt)
    assert is_nested(sub) and len(pairs_from_table(sub)) > 0


# ------------------------------------------------------------------- pair lists


def test_pairs_round_trip():
    pt = from_dot_bracket("((.[..)).]", allow_pseudoknots=True)
    pairs = pairs_from_table(pt)
    assert pairs == [(0, 7), (1, 6), (3, 9)]
    assert np.array_equal(table_from_pairs(pairs, len(pt)), pt)
    assert np.array_equal(table_from_pairs([(j, i) for i, j in reversed(pairs)], len(pt)), pt)


@pytest.mark.parametrize(
    "pairs, n, fragment",
    [
        ([(0, 4)], 4, "pair (0, 4): position 4 out of range [0, 4)"),
        ([(-1, 2)], 4, "position -1 out of range"),
        ([(2, 2)], 4, "position 2 is paired with itself"),
        ([(0, 3), (3, 1)], 4, "position 3 is in two pairs: (0, 3) and (1, 3)"),
    ],
)
def test_table_from_pairs_errors(pairs, n, fragment):
    with pytest.raises(StructureError) as info:
        table_from_pairs(pairs, n)
    assert fragment in str(info.value)
