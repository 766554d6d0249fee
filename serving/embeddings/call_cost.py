"""What one more engine call costs, in padded tokens: the price the token batcher weighs padding against.

An encoder call costs about ``a + b x padded tokens``. On the CPU (MiniLM-L6, onnxruntime, 2 cores,
one thread a call) a fit over 443 calls gave a = 2.0 ms and b = 0.219 ms a token (r2 0.997): one call
more costs what 9 padded tokens do. So a row 3 tokens shorter than its call's longest is worth padding
when the other choice is a call of its own, and 30 rows padded by 3 tokens each are not. On a GPU the
per-call share is far larger. Rather than a constant for one machine, each batcher fits ``a`` and ``b``
on its own calls (least squares over the recent ones, older calls weighing less) and uses ``a / b``;
until it has seen calls of enough different sizes it uses ``DEFAULT_TOKENS``.
"""
from __future__ import annotations

from dataclasses import dataclass

DEFAULT_TOKENS = 8.0
MIN_CALLS = 16     # calls seen before the fit is trusted
DECAY = 0.98       # each call's weight in the fit, a call later (about the last 50 calls count)
BOUNDS = (1.0, 4096.0)


@dataclass
class CallCost:
    """Weighted sums of (padded tokens, seconds) for a least-squares line."""
    n: float = 0.0
    x: float = 0.0
    y: float = 0.0
    xx: float = 0.0
    xy: float = 0.0
    seen: int = 0

    def observe(self, padded_tokens: int, seconds: float) -> None:
        self.n, self.x, self.y = self.n * DECAY + 1, self.x * DECAY + padded_tokens, self.y * DECAY + seconds
        self.xx = self.xx * DECAY + padded_tokens * padded_tokens
        self.xy = self.xy * DECAY + padded_tokens * seconds
        self.seen += 1

    @property
    def tokens(self) -> float:
        """One call's fixed cost in padded tokens (``a / b``), within ``BOUNDS``."""
        spread = self.n * self.xx - self.x * self.x  # n^2 x the variance of the sizes
        if self.seen < MIN_CALLS or spread <= 1e-9 * max(1.0, self.xx * self.n):
            return DEFAULT_TOKENS
        slope = (self.n * self.xy - self.x * self.y) / spread
        intercept = (self.y - slope * self.x) / self.n
        if slope <= 0:  # times that do not grow with the tokens (a fake, or noise): nothing to go on
            return DEFAULT_TOKENS
        return min(BOUNDS[1], max(BOUNDS[0], intercept / slope))
