"""95% intervals for rates counted over questions (EM, search hit rate, finish rate), and for the
gap between two such rates: what the plot, the orderings check and the reports print.

Wilson's score interval for one rate (it stays inside [0, 1] and is sensible at 0 or n
successes, where the normal approximation gives a zero-width interval), and Newcombe's hybrid
score interval for a difference of two independent rates, built from the two Wilson intervals
(Newcombe 1998, method 10): a gap is "within noise" when that interval contains 0. For two
models evaluated on the same questions, McNemar's exact test on the questions only one of them
got right.
"""

from __future__ import annotations

import math

Z95 = 1.959964


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float] | None:
    """The Wilson score interval for k successes out of n (95% by default); None when n = 0."""
    if n <= 0:
        return None
    if not 0 <= k <= n:
        raise ValueError(f"successes {k} must lie between 0 and {n}")
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    # at k = 0 (k = n) the bound is exactly 0 (1); computed, it can come out as 5e-17
    low = 0.0 if k == 0 else max(0.0, centre - half)
    high = 1.0 if k == n else min(1.0, centre + half)
    return low, high


def rate_interval(rate: float, n: int) -> tuple[float, float] | None:
    """Wilson interval for a rate given as a fraction of n 0/1 outcomes (an EM over n questions)."""
    return wilson(round(rate * n), n) if n else None


def difference_interval(k1: int, n1: int, k2: int, n2: int) -> tuple[float, float] | None:
    """Newcombe's 95% interval for p1 - p2 from the two Wilson intervals; None if either n is 0."""
    a, b = wilson(k1, n1), wilson(k2, n2)
    if a is None or b is None:
        return None
    p1, p2 = k1 / n1, k2 / n2
    gap = p1 - p2
    return (gap - math.sqrt((p1 - a[0]) ** 2 + (b[1] - p2) ** 2),
            gap + math.sqrt((a[1] - p1) ** 2 + (p2 - b[0]) ** 2))


def mcnemar_exact(only_first: int, only_second: int) -> float:
    """McNemar's exact two-sided p for paired 0/1 outcomes: under "no difference" each question
    that only one model got right is equally likely to be either's, so the split of the
    discordant questions is Binomial(n, 1/2)."""
    n, low = only_first + only_second, min(only_first, only_second)
    if n == 0:
        return 1.0
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(low + 1)) / 2 ** n)
