"""Which queued requests start at a step boundary: a small policy the scheduler asks once per step, so another
order (shortest first, priorities, fairness between clients) is another class with the same `admit`."""

from collections import deque
from dataclasses import dataclass
from typing import Protocol

from .requests import GenerationRequest


class AdmissionPolicy(Protocol):
    def admit(
        self, queue: deque[GenerationRequest], free_rows: int, running: list[GenerationRequest]
    ) -> list[GenerationRequest]:
        """Remove from `queue` and return the requests to start now: at most `free_rows`, given the `running`
        ones."""


@dataclass
class FirstComeFirstServed:
    """The queue's head while a row is free and, with `max_batch_tokens`, the tokens reserved by the running
    requests (prompt + max_new_tokens each, summed) stay within it. A head that does not fit waits, and so does
    everything behind it: no request is overtaken."""

    max_batch_tokens: int | None = None

    def admit(
        self, queue: deque[GenerationRequest], free_rows: int, running: list[GenerationRequest]
    ) -> list[GenerationRequest]:
        reserved = sum(request.reserved_tokens for request in running)
        admitted = []
        while queue and len(admitted) < free_rows:
            size = queue[0].reserved_tokens
            if self.max_batch_tokens is not None and reserved + size > self.max_batch_tokens:
                break
            reserved += size
            admitted.append(queue.popleft())
        return admitted
