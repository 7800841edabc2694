"""What a batch job reports after each round: the rows that ended, on every process, and what each process did."""

from typing import NamedTuple


class Work(NamedTuple):
    """What one process did in a round (model forwards: batched calls, each counted once)."""

    process: int
    rows: int
    tokens: int
    forwards: int


class Round(NamedTuple):
    results: list[tuple[int, dict]]
    """`(row index, result)` of every row finished in the round, on all processes."""
    work: list[Work]
