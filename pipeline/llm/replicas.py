"""Several servers of one model (replicas, no proxy in front): which one takes the next request.

    llm:
      backend: openai
      base_url: [http://node1:8000/v1, http://node2:8000/v1]   # one URL, or a list of replicas

Each request goes to the replica with the fewest requests in flight (ties: the one used least
recently), and never more than `max_concurrency` at once to one replica, so every server keeps
its continuous batch full. A replica whose request failed for good (its retries ran out on a
timeout, a refused connection, a 5xx) is set aside for `DOWN_S` seconds: its next requests go to
the others, and the failed request is sent once more to a replica that is up. When every replica
is down they are all used again (each request then fails on its own, naming its replica).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

DOWN_S = 60.0  # how long a failed replica is passed over before it is tried again


@dataclass
class Replica:
    url: str
    number: int  # 1-based, as the user listed it
    in_flight: int = 0
    last_used: int = 0  # a tick count: ties go to the replica used least recently
    down_until: float = 0.0


class ReplicaSet:
    """Hands out replicas under a per-replica bound; thread-safe."""

    def __init__(self, urls: list[str], max_concurrency: int, *,
                 clock: Callable[[], float] = time.monotonic):
        self.replicas = [Replica(url, i) for i, url in enumerate(urls, 1)]
        self.max_concurrency = max_concurrency
        self._clock = clock
        self._ticks = 0
        self._free = threading.Condition()

    def __len__(self) -> int:
        return len(self.replicas)

    def name(self, replica: Replica) -> str:
        """How errors name a replica: its URL, and its place in the list when there are several."""
        if len(self.replicas) == 1:
            return replica.url
        return f"replica {replica.number} of {len(self.replicas)} ({replica.url})"

    def acquire(self, avoid: set[str] = frozenset()) -> Replica:
        """The least busy replica that is up (and not in `avoid`), waiting while all are full."""
        with self._free:
            while True:
                replica = self._pick(avoid)
                if replica is not None:
                    replica.in_flight += 1
                    self._ticks += 1
                    replica.last_used = self._ticks
                    return replica
                self._free.wait()

    def release(self, replica: Replica, failure: str | None = None) -> None:
        """Give the slot back; `failure` (a one-line reason) sets the replica aside for a while."""
        with self._free:
            replica.in_flight -= 1
            if failure is not None and len(self.replicas) > 1:
                if replica.down_until <= self._clock():
                    log.warning("%s failed (%s); its requests go to the other replicas for %.0f s",
                                self.name(replica), failure, DOWN_S)
                replica.down_until = self._clock() + DOWN_S
            self._free.notify_all()

    def others_up(self, tried: set[str]) -> bool:
        """Whether a replica not yet `tried` for this request is up (worth a failover)."""
        now = self._clock()
        with self._free:
            return any(r.url not in tried and r.down_until <= now for r in self.replicas)

    def _pick(self, avoid: set[str]) -> Replica | None:
        now = self._clock()
        candidates = [r for r in self.replicas if r.url not in avoid] or self.replicas
        up = [r for r in candidates if r.down_until <= now] or candidates
        open_ = [r for r in up if r.in_flight < self.max_concurrency]
        if not open_:
            return None
        return min(open_, key=lambda r: (r.in_flight, r.last_used))
