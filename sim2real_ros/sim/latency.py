"""Transport latency between the controller and the drive: delay, per-message jitter, drops."""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class LatencyParams:
    """Delays in seconds, jitter as a per-message standard deviation, drop probabilities."""

    observation_delay_s: float = 0.0
    observation_jitter_s: float = 0.0
    observation_drop_prob: float = 0.0
    action_delay_s: float = 0.0
    action_jitter_s: float = 0.0
    action_drop_prob: float = 0.0


class DelayLine:
    """Messages leave in order after delay + |jitter|; some are lost on the way."""

    def __init__(
        self, delay_s: float, jitter_s: float, drop_prob: float, rng: np.random.Generator
    ) -> None:
        self.delay_s = delay_s
        self.jitter_s = jitter_s
        self.drop_prob = drop_prob
        self._rng = rng
        self._queue: list[tuple[float, int, Any]] = []
        self._seq = 0
        self._last_release = -np.inf
        self.dropped = 0
        self.sent = 0

    def sample_delay(self) -> float:
        """Return one message's delay: the base delay plus non-negative jitter."""
        if self.jitter_s > 0:
            return self.delay_s + abs(float(self._rng.normal(0.0, self.jitter_s)))
        return self.delay_s

    def push(self, t_s: float, item: Any) -> bool:
        """Send an item at t_s; return False if it is lost."""
        self.sent += 1
        if self.drop_prob > 0 and float(self._rng.random()) < self.drop_prob:
            self.dropped += 1
            return False
        # A link delivers in order: a message never overtakes the previous one.
        release = max(t_s + self.sample_delay(), self._last_release)
        self._last_release = release
        heapq.heappush(self._queue, (release, self._seq, item))
        self._seq += 1
        return True

    def next_release_s(self) -> float:
        """Return when the next queued item arrives (inf when empty)."""
        return self._queue[0][0] if self._queue else np.inf

    def pop_due(self, t_s: float) -> list[Any]:
        """Return the items that have arrived by t_s, oldest first."""
        out = []
        while self._queue and self._queue[0][0] <= t_s + 1e-12:
            out.append(heapq.heappop(self._queue)[2])
        return out

    def clear(self) -> None:
        """Forget everything in flight."""
        self._queue.clear()
        self._last_release = -np.inf
