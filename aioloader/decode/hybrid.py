"""How much of each batch the CPU workers decode when the GPU decodes the rest (pure).

With ``ImageDecoder(device="cuda")`` the GPU decodes the JPEGs and the CPU workers decode
what it cannot; idle, they would waste the machine's cores. So they take a share of every
batch too, and the loader's rate becomes the sum of both rates. DALI fixes that share as a
constant (``hw_decoder_load``); here it is measured: the share grows while the workers are
idle and shrinks once they are saturated, so it settles where they are just busy, which is
where the two sides finish a batch together:

- the workers' utilization (their mean decodes in flight over their number, over the last
  ``interval`` seconds) below ``low``: the share grows by ``step``;
- above ``high``: it shrinks by ``step``;
- in between, it stays; it never exceeds ``most`` (the GPU always keeps some of each batch,
  so its rate keeps being part of the sum).

When the trainer is the slowest of all, both sides idle and the share grows to ``most``: the
rate is the trainer's either way.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["HybridShare"]


@dataclass
class HybridShare:
    """The CPU workers' share of the device-decodable samples of each chunk (0..``most``)."""

    step: float = 0.05
    low: float = 0.85
    high: float = 0.97
    most: float = 0.9
    interval: float = 0.5
    share: float = 0.0
    _since: float | None = None

    def due(self, now: float) -> bool:
        """Whether ``interval`` seconds have passed since the last :meth:`observe` (the
        first call starts the clock)."""
        if self._since is None:
            self._since = now
            return False
        return now - self._since >= self.interval

    def observe(self, utilization: float, now: float) -> float:
        """The new share, given the workers' ``utilization`` (0..1) since the last call."""
        self._since = now
        if utilization < self.low:
            self.share = min(self.most, self.share + self.step)
        elif utilization > self.high:
            self.share = max(0.0, self.share - self.step)
        return self.share

    def cpu_count(self, n: int) -> int:
        """How many of ``n`` samples the CPU workers take now."""
        return min(n, int(self.share * n + 0.5))
