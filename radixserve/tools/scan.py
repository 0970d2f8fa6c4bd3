"""What a format's call scanner reports about the text after a call's opening marker."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from radixserve.tools.json_scan import RawCall


@dataclass(frozen=True)
class Pending:
    """Not decided yet: more text may complete (or break) the call."""


@dataclass(frozen=True)
class Found:
    """`body[:used]` held these calls (one, or several for a format that lists them)."""

    calls: tuple[RawCall, ...]
    used: int


@dataclass(frozen=True)
class Malformed:
    """Not a call: the marker and `body[:used]` are content; the text after is read again."""

    used: int


Scan = Pending | Found | Malformed
PENDING = Pending()


class CallScanner(ABC):
    """Reads one call after its opening marker. `body` is all the text after the marker so far;
    it only grows between calls, so a scanner may keep where it stopped.

    A scanner's answer must depend only on the text, never on how it arrived: `push` answers
    `Pending` while more text could change the answer, and it is what makes every split of an
    output into stream pieces parse alike."""

    @abstractmethod
    def push(self, body: str) -> Scan: ...

    @abstractmethod
    def close(self, body: str) -> Found | Malformed:
        """The output ended with this body."""
