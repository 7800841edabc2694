"""What a continuous-batching client hands in, the messages that carry it to the decoding thread, and what it
gets back, step by step."""

import uuid
from dataclasses import dataclass, field

from ..generation import WeDLMStats
from ..generation.outputs import ERROR
from ..generation.sampling import SamplingParams


@dataclass
class GenerationRequest:
    """One prompt to continue, with its own budget, stop strings and sampling. The rest (WeDLM settings, EOS, other
    logits processors) is shared by the scheduler's batch."""

    input_ids: list[int]
    max_new_tokens: int
    stop_strings: list[str] | None = None
    """Strings that end the output once it contains one (needs the scheduler's tokenizer)."""
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    sampling: SamplingParams | None = None
    """Its sampling; None: the scheduler's generation config's. Seeded, its tokens do not depend on the other
    requests decoding beside it."""

    @property
    def reserved_tokens(self) -> int:
        """The most tokens it can hold in the batch: its prompt and its whole budget."""
        return len(self.input_ids) + self.max_new_tokens


@dataclass
class RequestResult:
    request_id: str
    tokens: list[int]
    """The generated tokens (EOS included when it ended the output)."""
    finish_reason: str
    """`EOS`, `STOP` (a stop string), `LENGTH`, `CANCELLED` or `ERROR` (see `error`): generation/outputs.py."""
    stats: WeDLMStats | None = None
    """The request's WeDLM statistics, as a `generate` call of its own would report them."""
    error: str | None = None


@dataclass
class RequestUpdate:
    """What one scheduler step produced for one request: its newly committed tokens, and its result if it ended."""

    request_id: str
    new_tokens: list[int]
    result: RequestResult | None = None

    @property
    def finished(self) -> bool:
        return self.result is not None


def error_update(request_id: str, error: Exception) -> RequestUpdate:
    """The final update of a request that `error` ended (its tokens so far are not an answer)."""
    message = f"{type(error).__name__}: {error}"
    return RequestUpdate(request_id, [], RequestResult(request_id, [], ERROR, error=message))


@dataclass(frozen=True)
class Add:
    """Message to the decoding thread: queue `request`."""

    request: GenerationRequest


@dataclass(frozen=True)
class Cancel:
    """Message to the decoding thread: end request `request_id` at the next step boundary."""

    request_id: str


@dataclass(frozen=True)
class Close:
    """Message to the decoding thread: fail what is queued or running, then stop."""


Message = Add | Cancel | Close
