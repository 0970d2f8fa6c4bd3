"""The two interfaces that keep the grammar library replaceable.

`GrammarBackend` (one per engine): compile a `GrammarSpec`, make a matcher for
a compiled grammar, allocate a batch bitmask. `Matcher` (one per completion):
the grammar's state after the tokens accepted so far. Bitmasks use xgrammar's
layout, `[rows, ceil(vocab / 32)]` int32, bit j of a row set when token j is
allowed, which the sampler applies with xgrammar's kernel.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from radixserve.constrained.spec import GrammarSpec


class Matcher(Protocol):
    def accept_token(self, token_id: int) -> bool:
        """Advance by one token; False (state unchanged) when the grammar rejects it."""
        ...

    def rollback(self, num_tokens: int) -> None: ...

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the tokens allowed next into `bitmask[row]` (EOS only where the grammar can end)."""
        ...

    def is_terminated(self) -> bool:
        """The grammar accepted its end (a stop token): the output is complete."""
        ...

    def forced_string(self) -> str:
        """The text every continuation starts with from here ("" when the next byte is free)."""
        ...

    def forced_stop(self) -> int | None:
        """The stop token, when the grammar is complete and allows no other token now."""
        ...


class GrammarBackend(Protocol):
    vocab_size: int

    def compile(self, spec: GrammarSpec) -> Any:
        """A compiled grammar (thread-safe, may block); ValueError naming the problem if it fails."""
        ...

    def matcher(self, compiled: Any) -> Matcher: ...

    def memory_bytes(self, compiled: Any) -> int:
        """About how much memory a compiled grammar holds (the cache's byte bound counts it)."""
        ...

    def allocate_bitmask(self, rows: int) -> torch.Tensor:
        """A host bitmask of `rows` rows, every token allowed."""
        ...

    def fill_bitmasks(self, matchers: list[Matcher], bitmask: torch.Tensor, rows: list[int]) -> None:
        """`matchers[i].fill_bitmask(bitmask, rows[i])` for all i (in parallel where it can)."""
        ...
