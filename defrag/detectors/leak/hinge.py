"""The best flat-then-line hinge of a series: the break whose hinge leaves the least squared
residual, as a plain loop of one line fit per candidate break finds it — to the bit.

The loop's fits are many (one per bin of the rising part's candidates) and each is a handful of
small numpy calls. Here every candidate's residual sum is first estimated at once, as rows of
one matrix (a closed form, summed in another order: close to each fit's own figure, not equal
to it); only the breaks whose estimate lies within a bound of the best estimate, far wider than
both computations' rounding, are then fitted as the loop fits them, in the loop's order, with
its strict comparison. The break the loop keeps is always among those (its own sum is the
least, so its estimate is within twice the rounding of every other estimate), and so is every
earlier break tying with it: the answer and its sum are the loop's. A series whose estimates
are not all finite is fitted break by break, as before.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from defrag.detect.series import FloatArray

ROUNDING_SHARE = 1e-9
"""The bound, per point, as a share of the series' squared deviations: some 10⁵ × what the
two sums' rounding can differ by (a few × the points × the float64 epsilon)."""


def line_sse(x: FloatArray, y: FloatArray) -> float:
    """The residual sum of squares of the least-squares line of ``y`` on ``x``."""
    xc = x - x.mean()
    yc = y - y.mean()
    sxx = float(xc @ xc)
    b = float(xc @ yc) / sxx if sxx > 0 else 0.0
    r = yc - b * xc
    return float(r @ r)


def hinge_sse(h: FloatArray, v: FloatArray, k: int) -> float:
    """:func:`line_sse` of the hinge that breaks at point ``k``: flat, then a line."""
    return line_sse(np.maximum(h - h[k], 0.0), v)


def best_break(h: FloatArray, v: FloatArray, first: int, last: int) -> tuple[int, float]:
    """(k, sse) of the plain loop: ``k`` = 0 with one line's ``sse``, replaced by each break
    ``k`` in ``first .. last − 1`` whose :func:`hinge_sse` is strictly less, in turn."""
    best_k, best_sse = 0, line_sse(h, v)
    for k in _contenders(h, v, first, last):
        sse = hinge_sse(h, v, k)
        if sse < best_sse:
            best_k, best_sse = k, sse
    return best_k, best_sse


def _contenders(h: FloatArray, v: FloatArray, first: int, last: int) -> Iterable[int]:
    """The breaks that may be the loop's answer, in the loop's order (all of them when the
    estimates cannot be trusted)."""
    everything = range(first, last)
    if last <= first or not bool((h[1:] > h[:-1]).all()):
        return everything  # a time repeated: a hinge may not rise at all (no estimate's bound)
    estimate, bound = estimates(h, v, first, last)
    if not (np.isfinite(estimate).all() and np.isfinite(bound)):
        return everything
    close = estimate <= float(estimate.min()) + bound
    return (first + int(i) for i in np.flatnonzero(close))


def estimates(h: FloatArray, v: FloatArray, first: int, last: int) -> tuple[FloatArray, float]:
    """The residual sum of the hinge of every break ``first .. last − 1``, estimated at once
    (Σ(y − ȳ)² − Sxy² / Sxx per row), and the bound within which they are compared: twice it
    exceeds what an estimate and its break's :func:`hinge_sse` can differ by."""
    ks = np.arange(first, last)
    x = np.maximum(h[None, :] - h[ks, None], 0.0)
    xc = x - x.mean(axis=1)[:, None]
    yc = v - v.mean()
    syy = float(yc @ yc)
    sxx = np.einsum("ij,ij->i", xc, xc)
    sxy = xc @ yc
    with np.errstate(divide="ignore", invalid="ignore"):
        estimate = syy - np.where(sxx > 0, sxy * sxy / sxx, 0.0)
    n = len(v)
    # the rounding of yc itself (its mean's) is shared by both computations; what each adds
    # is relative to the squared deviations, plus the magnitude's last bits where they vanish
    scale = syy + n * (np.finfo(float).eps * float(np.abs(v).max(initial=0.0))) ** 2
    return estimate, ROUNDING_SHARE * n * scale
