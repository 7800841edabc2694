"""`Sequence`: one running request as the engine holds it, from admission until its result is reported.

A request brings a prompt, a budget, stop strings and sampling (`GenerationRequest`); once admitted it also has a
row in the running batch, the K/V blocks that row holds, the tokens sent to it so far and, once it ended, why. All
of it lives here, in one record per request, so the scheduler reads a request's whole state in one place; the
decoding loop's tensors stay batched (generation/rows.py), and `RunningRequests` (running.py) is the one place
records and rows join and leave together.
"""

from dataclasses import dataclass, field

from ..generation import WeDLMStats
from ..generation.sampling import SamplingParams
from ..generation.window import InputRow
from .requests import GenerationRequest, RequestResult

NO_ROW = InputRow(-1)
"""The row of a record not (or no longer) in the running batch."""


@dataclass
class Sequence:
    request: GenerationRequest
    sampling: SamplingParams
    """Its sampling: the request's own, else the scheduler's generation config's."""
    row: InputRow = NO_ROW
    """Its row of the running batch's output record (`InputRow`); set and moved by `RunningRequests` alone."""
    blocks: list[int] = field(default_factory=list)
    """The K/V pool's blocks its row holds, in position order: the pool's own list for the row, which grows in
    place as the row reaches new positions (empty without a pool)."""
    tokens: list[int] = field(default_factory=list)
    """The generated tokens reported so far."""
    finish_reason: str = ""
    """Why it ended (generation/outputs.py); "" while it runs."""

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def prompt_ids(self) -> list[int]:
        return self.request.input_ids

    @property
    def max_new_tokens(self) -> int:
        return self.request.max_new_tokens

    @property
    def stop_strings(self) -> list[str] | None:
        return self.request.stop_strings

    def result(self, stats: WeDLMStats | None = None, error: str | None = None) -> RequestResult:
        """Its final answer: the tokens reported, why it ended and its statistics (or the error that ended it)."""
        return RequestResult(self.request_id, self.tokens, self.finish_reason, stats, error)
