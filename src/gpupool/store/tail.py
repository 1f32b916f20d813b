"""Reading a table by id as its rows come: what the metrics and the webhooks follow."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass
class Tail:
    """How far a table has been read by id. Ids are handed out when a row is written but become
    visible when its transaction commits, which on PostgreSQL is not in id order: an id skipped
    now may still come, so it is asked for again until `patience` seconds have passed (then its
    transaction was rolled back)."""

    mark: int = 0
    gaps: dict[int, float] = field(default_factory=dict)
    patience: float = 60.0

    def fresh(self, ids: Iterable[int], now: float) -> set[int]:
        """Of the ids just read (above the mark, or among the gaps), those not taken before;
        moves the mark and notes the ids it passed over."""
        seen = sorted(ids)
        new = {i for i in seen if i > self.mark or self.gaps.pop(i, None) is not None}
        above = [i for i in seen if i > self.mark]
        if above:
            for missing in set(range(self.mark + 1, above[-1])) - set(above):
                self.gaps[missing] = now
            self.mark = above[-1]
        for gap, since in list(self.gaps.items()):
            if now - since > self.patience:
                del self.gaps[gap]
        return new
