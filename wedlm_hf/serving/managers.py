"""What decodes a request: `GenerateEngine`, one `generate` call per request, one request at a time, or with
continuous batching `BatchingEngine` (batching.py). Both take a `Job` and put what it produces into its `Outputs`,
from their own thread; a request they cannot serve is refused by `submit` before anything is sent."""

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

import torch
from transformers import GenerationConfig, LogitsProcessorList, PreTrainedModel, PreTrainedTokenizerBase

from ..generation.outputs import LENGTH, STOP
from ..generation.validation import position_limit_error
from .errors import invalid_request
from .requests import take_carried

Output = list[int] | str | BaseException
"""New tokens, then the finish reason (`STOP` or `LENGTH`, OpenAI's words too) or the error that ended the request."""


class Outputs:
    """One request's outputs, put from a decoding thread and read on the server's event loop."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[Output] = asyncio.Queue()

    def put(self, output: Output) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, output)

    async def get(self) -> Output:
        return await self.queue.get()


@dataclass
class Job:
    """A request as an engine takes it: the prompt's tokens and the generation config it decodes with (requests.py;
    `max_new_tokens` set)."""

    request_id: str
    input_ids: list[int]
    config: GenerationConfig
    stream: bool
    outputs: Outputs = field(default_factory=Outputs)
    created: int = field(default_factory=lambda: int(time.time()))


class Engine(Protocol):
    max_sequence_length: int
    """The most prompt + output tokens a request may have."""

    def submit(self, job: Job) -> None: ...

    def cancel(self, request_id: str) -> None: ...

    def is_alive(self) -> bool: ...

    def close(self) -> None: ...


class _Cancelled(Exception):
    """Raised inside `generate` by the streamer of a request whose client has gone."""


class GenerateEngine:
    """`generate` per request with the request's generation config, one request at a time on one thread; a
    request's penalties go to `generate` as a logits processor, and its seed is set on that thread right before its
    call (set when the request arrives, a request decoding meanwhile would draw the seeded numbers)."""

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase):
        self.model, self.tokenizer = model, tokenizer
        self.max_sequence_length = model.config.get_text_config().max_position_embeddings  # RoPE models have one
        self.thread = ThreadPoolExecutor(1, thread_name_prefix="wedlm-generate")
        self.lock = threading.Lock()
        self.unfinished: set[str] = set()
        self.cancelled: set[str] = set()

    def submit(self, job: Job) -> None:
        problem = position_limit_error(
            self.model, len(job.input_ids), job.config.max_new_tokens, budget_name="max_tokens"
        )
        if problem is not None:
            raise invalid_request(f"The request's {problem}", "max_tokens")
        with self.lock:
            self.unfinished.add(job.request_id)
        self.thread.submit(self._run, job)

    def cancel(self, request_id: str) -> None:
        with self.lock:
            if request_id in self.unfinished:  # a cancel can come after its request ended
                self.cancelled.add(request_id)

    def is_alive(self) -> bool:
        return True

    def close(self) -> None:
        self.thread.shutdown(wait=False, cancel_futures=True)

    def _run(self, job: Job) -> None:
        try:
            if job.request_id not in self.cancelled:
                self._generate(job)
        except _Cancelled:
            pass
        except Exception as error:  # the request's own fault: the next one decodes as usual
            job.outputs.put(error)
        finally:
            with self.lock:
                self.unfinished.discard(job.request_id)
                self.cancelled.discard(job.request_id)

    def _generate(self, job: Job) -> None:
        seed, processors = take_carried(job.config, len(job.input_ids))
        if seed is not None:
            torch.manual_seed(seed)
        input_ids = torch.tensor([job.input_ids], device=self.model.device)
        streamer = _Streamer(self, job) if job.stream else None
        output = self.model.generate(
            input_ids, attention_mask=torch.ones_like(input_ids), generation_config=job.config,
            logits_processor=LogitsProcessorList(processors), streamer=streamer, tokenizer=self.tokenizer,
        )
        tokens = output[0, input_ids.shape[1] :].tolist()
        if streamer is None:
            job.outputs.put(tokens)
        job.outputs.put(LENGTH if len(tokens) >= job.config.max_new_tokens else STOP)


class _Streamer:
    """`generate`'s streamer for one request: its new tokens to its outputs as they come (the first `put` is the
    prompt), and `_Cancelled` raised into `generate` once the client has gone."""

    def __init__(self, engine: GenerateEngine, job: Job):
        self.engine, self.job, self.prompt_seen = engine, job, False

    def put(self, value: torch.Tensor) -> None:
        if self.job.request_id in self.engine.cancelled:
            raise _Cancelled
        if self.prompt_seen:
            self.job.outputs.put(value.flatten().tolist())
        self.prompt_seen = True

    def end(self) -> None:
        """Nothing: the engine puts the finish reason once `generate` returns."""
