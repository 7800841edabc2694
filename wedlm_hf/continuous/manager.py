"""`ContinuousBatcher`: the scheduler on a thread of its own, for Python callers (batch jobs, the demo, the server).

Requests are submitted from any thread and decoded together; each one's new tokens arrive as they are committed,
through its `RequestHandle` (iterate `stream()`, or wait for `result()`) or an `on_update` callback, called on
the decoding thread. Every submitted request gets exactly one final update: its result, a cancellation or an
error; if the decoding thread stops (closed, or killed by a fault outside any request), every request still
pending gets an error saying why, and later submissions are refused.
"""

import logging
import queue
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence

from ..generation.outputs import ERROR
from ..generation.sampling import SamplingParams
from .requests import Add, Cancel, Close, GenerationRequest, Message, RequestResult, RequestUpdate
from .scheduler import WeDLMScheduler

logger = logging.getLogger(__name__)

Listener = Callable[[RequestUpdate], None]


class RequestHandle:
    """One submitted request: its tokens as they come (`stream`), its result (`result`), `cancel`."""

    def __init__(self, batcher: "ContinuousBatcher", request_id: str):
        self.batcher, self.request_id = batcher, request_id
        self.updates: queue.SimpleQueue[RequestUpdate] = queue.SimpleQueue()
        self.final: RequestResult | None = None

    def stream(self, timeout: float | None = None) -> Iterator[list[int]]:
        """The newly committed tokens of each step until the request ends; `queue.Empty` after `timeout` s idle."""
        while self.final is None:
            update = self.updates.get(timeout=timeout)
            self.final = update.result
            if update.new_tokens:
                yield update.new_tokens

    def result(self, timeout: float | None = None) -> RequestResult:
        """The request's result once it ended (check `finish_reason` / `error`)."""
        for _ in self.stream(timeout):
            pass
        return self.final

    def cancel(self) -> None:
        self.batcher.cancel(self.request_id)


class ContinuousBatcher:
    """A `WeDLMScheduler` (its arguments) decoding on a background thread until `close()` (or the `with` block
    ends)."""

    def __init__(self, model, generation_config=None, **scheduler_options):
        self.scheduler = WeDLMScheduler(model, generation_config, **scheduler_options)
        self.inbox: queue.SimpleQueue[Message] = queue.SimpleQueue()
        self.listeners: dict[str, Listener] = {}
        self.lock = threading.Lock()
        self.stopped: str | None = None
        """Why the decoding thread stopped (set before the requests still pending fail); None while it runs."""
        self.thread = threading.Thread(target=self._decode, name="wedlm-continuous-batching", daemon=True)
        self.thread.start()

    def submit(
        self,
        input_ids: Sequence[int],
        max_new_tokens: int,
        *,
        stop_strings: list[str] | None = None,
        request_id: str | None = None,
        sampling: SamplingParams | None = None,
        on_update: Listener | None = None,
    ) -> RequestHandle:
        """Queue a prompt; raises a ValueError at once for a request that cannot be served."""
        request = GenerationRequest(
            [int(token) for token in input_ids], max_new_tokens, stop_strings, request_id or uuid.uuid4().hex,
            sampling,
        )
        return self.submit_request(request, on_update)

    def submit_request(self, request: GenerationRequest, on_update: Listener | None = None) -> RequestHandle:
        self.scheduler.check(request)
        handle = RequestHandle(self, request.request_id)
        with self.lock:  # `_stop` fails every listener registered before it, under the same lock
            if not self.is_alive():
                raise RuntimeError(f"The continuous batcher has stopped: {self.stopped or 'its thread ended'}")
            if request.request_id in self.listeners:
                raise ValueError(f"A request with id {request.request_id!r} is already queued or running.")
            self.listeners[request.request_id] = on_update or handle.updates.put
        self.inbox.put(Add(request))
        return handle

    def cancel(self, request_id: str) -> None:
        self.inbox.put(Cancel(request_id))

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, **options) -> list[RequestResult]:
        """Decode every prompt (batched as they fit) and return the results in order."""
        handles = [self.submit(prompt, max_new_tokens, **options) for prompt in prompts]
        return [handle.result() for handle in handles]

    def is_alive(self) -> bool:
        return self.stopped is None and self.thread.is_alive()

    def close(self, timeout: float | None = 10) -> None:
        """Fail what is still queued or running, then stop the decoding thread."""
        if self.thread.is_alive():
            self.inbox.put(Close())
            self.thread.join(timeout)

    def __enter__(self) -> "ContinuousBatcher":
        return self

    def __exit__(self, *exception) -> None:
        self.close()

    def _decode(self) -> None:
        try:
            self._serve()
        except BaseException as error:  # e.g. KeyboardInterrupt, SystemExit: nothing more can be decoded
            logger.critical("continuous batching stopped", exc_info=True)
            self._stop(f"{type(error).__name__}: {error}")
        else:
            self._stop("closed")

    def _serve(self) -> None:
        scheduler = self.scheduler
        while True:
            messages = [] if scheduler.has_work() else [self.inbox.get()]
            while not self.inbox.empty():
                messages.append(self.inbox.get())
            for message in messages:
                if isinstance(message, Close):
                    self._dispatch(scheduler.fail_all(RuntimeError("the continuous batcher was closed")))
                    return
                if isinstance(message, Cancel):
                    scheduler.cancel(message.request_id)
                else:
                    self._add(message.request)
            if scheduler.has_work():
                try:
                    updates = scheduler.step()
                except Exception as error:  # outside any one request: fail them all, go on
                    logger.exception("continuous batching step failed")
                    updates = scheduler.fail_all(error)
                self._dispatch(updates)

    def _stop(self, reason: str) -> None:
        """Refuse new requests, then fail every request still pending (queued, running, or submitted as the thread
        ended)."""
        with self.lock:
            self.stopped = reason
            pending = list(self.listeners)
        error = f"The continuous batching engine stopped ({reason}); the request cannot finish."
        self._dispatch([RequestUpdate(rid, [], RequestResult(rid, [], ERROR, error=error)) for rid in pending])

    def _add(self, request: GenerationRequest) -> None:
        try:
            self.scheduler.add(request)
        except ValueError as error:
            result = RequestResult(request.request_id, [], ERROR, error=str(error))
            self._dispatch([RequestUpdate(request.request_id, [], result)])

    def _dispatch(self, updates: list[RequestUpdate]) -> None:
        for update in updates:
            with self.lock:
                listener = self.listeners.get(update.request_id)
                if update.finished:
                    self.listeners.pop(update.request_id, None)
            if listener is None:
                continue
            try:
                listener(update)
            except Exception:  # a listener's fault is its own request's, never the batch's
                logger.exception("update listener of request %s failed", update.request_id)
