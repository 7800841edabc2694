"""`BlockTable`: which fixed-size blocks of the K/V pool (kv_pool.py) each row holds, and which are free.

The pool's K/V are `capacity * block_size` slots per layer. A row's K/V at logical position `p` live in slot
`table[row, p // block_size] * block_size + p % block_size`: a row holds blocks for the positions it has reached
(its committed K/V and the window it feeds), wherever they are in the pool, so the pool's bytes follow the tokens
the rows hold, not their budgets, and a row that leaves hands its blocks back without moving anyone's K/V.

Which block belongs to whom is host bookkeeping (lists of ints, from the sizes the step's one host read brings);
the device holds only `table`, (rows, blocks) block ids, which the forward turns into slot indices for its
gathers (`slots`). Entries past a row's own blocks are 0 and never read: positions are clamped to the row's own.
"""

import torch

from .window import Updates

BLOCK_SIZE = 16
"""Positions per block where rows grow block by block (continuous batching): the most a row holds past its need
is one block less a slot."""


def blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


class BlockTable:
    def __init__(self, block_size: int, device: torch.device):
        self.block_size = block_size
        self.capacity = 0
        """Blocks in the pool's storage."""
        self.free: list[int] = []
        """Free block ids; the last is taken first (the most recently freed, then the lowest new one)."""
        self.held: list[list[int]] = []
        """Each row's blocks, in position order."""
        self.table = torch.zeros((0, 1), dtype=torch.long, device=device)
        """(rows, blocks) `held` on the device, zero-padded."""

    def add_capacity(self, capacity: int) -> None:
        """The storage now holds `capacity` blocks: the new ones are free, taken after those freed before."""
        self.free = list(range(capacity - 1, self.capacity - 1, -1)) + self.free
        self.capacity = capacity

    def missing(self, tokens: list[int]) -> list[int]:
        """Per row, how many blocks it lacks to hold `tokens[row]` positions."""
        return [max(blocks_for(t, self.block_size) - len(held), 0) for t, held in zip(tokens, self.held)]

    def extend(self, missing: list[int]) -> None:
        """Give each row its `missing` blocks (`missing()`; the pool holds enough free ones)."""
        entries = []
        for row, count in enumerate(missing):
            if count:
                held, taken = self.held[row], self._take(count)
                entries += [(row, len(held) + i, block) for i, block in enumerate(taken)]
                held += taken
        if entries:
            rows, columns, blocks = torch.tensor(entries, device=self.table.device).unbind(1)
            self.table = _widened(self.table, max(column for _, column, _ in entries) + 1)
            self.table[rows, columns] = blocks

    def joined(self, tokens: list[int]) -> tuple[Updates, torch.Tensor]:
        """Rows after the held ones, each with blocks for `tokens[row]` positions (the pool holds enough free ones):
        the updates (built, not set; their blocks are free until then, so no row reads them) and their table."""
        free = list(self.free)
        held = [[free.pop() for _ in range(blocks_for(t, self.block_size))] for t in tokens]
        width = max(map(len, held), default=1)
        theirs = torch.tensor([h + [0] * (width - len(h)) for h in held], dtype=torch.long, device=self.table.device)
        table = torch.cat([_widened(self.table, width), _widened(theirs, self.table.shape[1])])
        return [(self, {"free": free, "held": self.held + held, "table": table})], theirs

    def select(self, kept: list[int], index: torch.Tensor) -> None:
        """Only rows `kept` (`index` on the device) stay; the others' blocks are free."""
        keep = set(kept)
        self.free += [block for row, held in enumerate(self.held) if row not in keep for block in reversed(held)]
        self.held = [self.held[row] for row in kept]
        self.table = self.table[index]

    def slots(self, positions: torch.Tensor, table: torch.Tensor | None = None) -> torch.Tensor:
        """The storage slots of `positions` (rows, n): each row's through its own row of `table` (default: the
        held rows')."""
        table = self.table if table is None else table
        return table.gather(1, positions // self.block_size) * self.block_size + positions % self.block_size

    def _take(self, count: int) -> list[int]:
        taken = self.free[-count:][::-1]
        del self.free[-count:]
        return taken


def _widened(table: torch.Tensor, width: int) -> torch.Tensor:
    """`table` zero-padded to at least `width` columns."""
    if table.shape[1] >= width:
        return table
    return torch.cat([table, table.new_zeros((table.shape[0], width - table.shape[1]))], dim=1)
