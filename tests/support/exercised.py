"""What a property test's examples exercised, counted over the whole run.

A property about preemptions that never meets one proves nothing: such a test counts, at each
example, what it claims to check (`note`), and after its last example asserts that enough of them
showed it (`assert_shown`). Each thing noted is also a `hypothesis.event`, so `--hypothesis-show-
statistics` prints how often it came up.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from hypothesis import event


@dataclass
class Exercised:
    """Counts of the examples that showed each thing, and of all examples."""

    counts: Counter[str] = field(default_factory=Counter)

    def note(self, **shown: bool) -> None:
        """One example ran; it showed each thing given True."""
        self.counts["examples"] += 1
        for name, yes in shown.items():
            if yes:
                self.counts[name] += 1
                event(name)

    def assert_shown(self, *names: str, share: float = 0.05) -> None:
        """Each of `names` showed in at least `share` of the examples (and in one at least)."""
        examples = self.counts["examples"]
        assert examples > 0, "no example ran"
        for name in names:
            needed = max(1, int(share * examples))
            assert self.counts[name] >= needed, (
                f"{name}: shown in {self.counts[name]} of {examples} examples, fewer than {needed}: "
                "the examples do not exercise what the test checks"
            )
