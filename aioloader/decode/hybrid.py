"""How much of each batch the CPU workers decode when the GPU decodes the rest (pure).

With ``ImageDecoder(device="cuda")`` the GPU decodes the JPEGs and the CPU workers decode
what it cannot; idle, they would waste the machine's cores. So they take a share of every
batch too. DALI fixes that share as a constant (``hw_decoder_load``); here it is steered,
every ``interval`` seconds, by two measures over that interval:

- ``u``, the workers' utilization (their mean decodes in flight over their number, 0..1);
- ``w``, the trainer's wait share (the fraction of wall time it waited for batches, 0..1;
  see :mod:`aioloader.observe.trainerwait`), or None while it is not known (no batch
  delivered yet, or a stage built without a meter).

What the share should do depends on what limits training, which only the trainer's wait
tells (:func:`steer`):

- **the trainer waits** (``w > waits``, the bottleneck verdict's
  :data:`~aioloader.observe.bottleneck.WAIT_SHARE`): loading is the limit, and the rate is the
  sum of both sides' rates. Workers saturated (``u > high``): the share shrinks, so the GPU
  takes what the CPUs cannot serve (ResNet-18: every sample the CPUs cannot decode in time
  should go to the GPU). Workers idle (``u < low``): it grows, idle cores help. Between: it
  holds, where both sides finish a batch together.
- **the trainer does not wait**: the GPU is the limit (ResNet-50), and a JPEG decoded on it
  takes GPU time from training. The share grows while the workers have room (``u < high``),
  moving decode off the GPU onto free cores, and holds once they are saturated (shrinking
  would put work back on the busy GPU; if the workers then fall behind, the trainer waits and
  the rule above takes the share down).
- **the wait is unknown**: by the workers alone: ``u < low`` grows, ``u > high`` shrinks.

Each move is ``step``; the share stays within 0..``most`` (the GPU always keeps some of each
batch, so its rate keeps being part of the sum). Each decision carries one line saying what
was seen and what was done (``stats.device_decode.share_reason``).
"""

from __future__ import annotations

from dataclasses import dataclass

from aioloader.observe.bottleneck import WAIT_SHARE

__all__ = ["Decision", "HybridShare", "steer"]


@dataclass(frozen=True)
class Decision:
    """A new ``share`` (0..``most``) and why, in one line for a person."""

    share: float
    reason: str


def steer(
    share: float,
    utilization: float,
    wait: float | None,
    *,
    step: float = 0.05,
    low: float = 0.85,
    high: float = 0.97,
    most: float = 0.9,
    waits: float = WAIT_SHARE,
) -> Decision:
    """The share after one interval in which the workers were busy ``utilization`` (0..1)
    and the trainer waited ``wait`` of the time (0..1; None: unknown). See the module."""
    busy = f"workers busy {utilization:.0%}"
    if wait is None:
        seen = f"trainer's wait unknown, {busy}"
        move = 1 if utilization < low else -1 if utilization > high else 0
    elif wait > waits:
        seen = f"trainer waited {wait:.0%}, {busy}"
        move = 1 if utilization < low else -1 if utilization > high else 0
    else:
        seen = f"trainer did not wait ({wait:.0%}), {busy}"
        move = 1 if utilization < high else 0
    new = min(most, share + step) if move > 0 else max(0.0, share - step) if move < 0 else share
    return Decision(new, f"{seen}: {_action(move, new, share, most)}")


def _action(move: int, new: float, old: float, most: float) -> str:
    if move > 0 and new > old:
        return f"the workers take more, share {new:.0%}"
    if move > 0:
        return f"the share stays at its most, {most:.0%}"
    if move < 0:
        return f"the GPU takes more, share {new:.0%}" if new < old else "the GPU already takes all"
    return f"the share holds at {new:.0%}"


@dataclass
class HybridShare:
    """The CPU workers' share of the device-decodable samples of each chunk (0..``most``),
    moved by :func:`steer` at most every ``interval`` seconds; ``reason``: why it last moved
    or held (empty before the first decision)."""

    step: float = 0.05
    low: float = 0.85
    high: float = 0.97
    most: float = 0.9
    interval: float = 0.5
    waits: float = WAIT_SHARE
    share: float = 0.0
    reason: str = ""
    _since: float | None = None

    def due(self, now: float) -> bool:
        """Whether ``interval`` seconds have passed since the last :meth:`observe` (the
        first call starts the clock)."""
        if self._since is None:
            self._since = now
            return False
        return now - self._since >= self.interval

    def observe(self, utilization: float, now: float, wait: float | None = None) -> float:
        """The new share, given the workers' ``utilization`` (0..1) and the trainer's
        ``wait`` share (0..1, None: unknown) since the last call."""
        self._since = now
        decision = steer(
            self.share,
            utilization,
            wait,
            step=self.step,
            low=self.low,
            high=self.high,
            most=self.most,
            waits=self.waits,
        )
        self.share, self.reason = decision.share, decision.reason
        return self.share

    def cpu_count(self, n: int) -> int:
        """How many of ``n`` samples the CPU workers take now."""
        return min(n, int(self.share * n + 0.5))
