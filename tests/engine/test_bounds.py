"""Range checks of user-given numbers: what each refuses (with the setting named) and the edges it takes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from engine.bounds import COUNT_MAX, MS_MAX, S_MAX, SEED_MAX, check_count, check_ms, check_seconds, check_seed
from engine.errors import DualhubError


@pytest.mark.parametrize("good", [0, 1, SEED_MAX, np.int64(5)])
def test_a_seed_is_any_int64_at_or_above_zero(good):
    check_seed(good)


@pytest.mark.parametrize("bad", [-1, SEED_MAX + 1, 10**23, 1.0, True, "1", None])
def test_a_seed_outside_int64_or_not_an_integer_is_refused_by_name(bad):
    with pytest.raises(DualhubError, match=r"^--seed must be an integer from 0 to 2\*\*63 - 1"):
        check_seed(bad, "--seed")


@pytest.mark.parametrize(("check", "high"), [(check_ms, MS_MAX), (check_seconds, S_MAX)])
def test_a_duration_is_finite_positive_and_bounded(check, high):
    for good in (1e-3, 1, high):
        check(good, "x")
    for bad in (0, -1, math.nan, math.inf, -math.inf, high * 2, 10**23, True, "5"):
        with pytest.raises(DualhubError, match=r"^x must be a finite number > 0"):
            check(bad, "x")


def test_zero_is_a_duration_only_where_allowed():
    check_ms(0, "interval", zero=True)
    check_seconds(0.0, "every", zero=True)
    with pytest.raises(DualhubError, match=r">= 0"):
        check_ms(-1, "interval", zero=True)
    with pytest.raises(DualhubError, match=r">= 0"):
        check_seconds(math.nan, "every", zero=True)


def test_a_count_is_an_integer_in_range():
    check_count(1, "n")
    check_count(COUNT_MAX, "n")
    check_count(0, "n", low=0)
    for bad in (0, -3, COUNT_MAX + 1, 2.0, False):
        with pytest.raises(DualhubError, match=r"^n must be an integer from 1 to"):
            check_count(bad, "n")
