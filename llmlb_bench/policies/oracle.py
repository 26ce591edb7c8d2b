"""A noisy output-length oracle whose quality is a rank correlation.

Length-aware schedulers are judged by how well their predictor *orders*
requests, measured as Kendall's tau between predicted and true lengths
(Fu et al., "Efficient LLM Scheduling by Learning to Rank", NeurIPS 2024).
To ask "how good must a predictor be?", this oracle is built to hit a chosen
tau, whatever the length distribution:

1. The true length L is turned into a normal score z = Phi^-1(F(L)), with F
   the empirical distribution of lengths seen so far (mid-rank for ties).
2. A noisy score s = rho z + sqrt(1 - rho^2) e, e ~ N(0, 1), is drawn with
   rho = sin(pi tau / 2): for a bivariate normal pair, Kendall's tau is
   (2/pi) arcsin(rho) (Greiner's relation), so (z, s) has tau exactly.
3. The prediction is F^-1(Phi(s)): a length from the same distribution.
   Kendall's tau is invariant under increasing maps, so (L, prediction)
   keeps the tau of (z, s) up to ties and the warm-up of F.

tau = 1 returns the true length; tau = 0 an independent draw from the
length distribution; negative tau an adversarial predictor. F lives in a
Fenwick tree over lengths 1..``max_len`` (longer lengths share the top
bin), so a prediction costs O(log max_len).
"""

from __future__ import annotations

import math
from random import Random
from statistics import NormalDist

_STD = NormalDist()


class KendallOracle:
    """Predicts output lengths with a target Kendall tau against the truth."""

    __slots__ = ("tau", "max_len", "_rho", "_noise", "_rng", "_tree", "_n", "_top")

    def __init__(self, tau: float, seed: int = 0, max_len: int = 1 << 17) -> None:
        if not -1.0 <= tau <= 1.0:
            raise ValueError(f"tau must be in [-1, 1] (got {tau})")
        self.tau = tau
        self.max_len = max_len
        self._rho = math.sin(math.pi * tau / 2)
        self._noise = math.sqrt(max(0.0, 1.0 - self._rho**2))
        self._rng = Random(seed)
        self._tree = [0] * (max_len + 1)
        self._n = 0
        self._top = 1 << (max_len.bit_length() - 1)

    def _add(self, length: int) -> None:
        tree = self._tree
        while length <= self.max_len:
            tree[length] += 1
            length += length & -length

    def _count_le(self, length: int) -> int:
        tree = self._tree
        total = 0
        while length > 0:
            total += tree[length]
            length -= length & -length
        return total

    def _quantile(self, k: int) -> int:
        """Smallest length whose cumulative count reaches ``k`` (1 <= k <= n)."""
        tree = self._tree
        pos, step = 0, self._top
        while step:
            nxt = pos + step
            if nxt <= self.max_len and tree[nxt] < k:
                pos = nxt
                k -= tree[nxt]
            step >>= 1
        return pos + 1

    def predict(self, true_length: int) -> int:
        """A predicted length for a request whose true output length is ``true_length``."""
        length = min(max(int(true_length), 1), self.max_len)
        self._add(length)
        self._n += 1
        if self._noise == 0.0 and self._rho > 0:
            return length
        below = self._count_le(length - 1)
        equal = self._count_le(length) - below
        z = _STD.inv_cdf((below + 0.5 * equal) / self._n)
        s = self._rho * z + self._noise * self._rng.gauss(0.0, 1.0)
        k = min(self._n, max(1, math.ceil(_STD.cdf(s) * self._n)))
        return self._quantile(k)
