"""Runs WeDLM and autoregressive decoding of one prompt at the same time and reports their progress.

Each side is one `generate` call in its own thread, streaming committed tokens into a shared queue; the caller
iterates `race` for snapshots. A stop flag, read by a stopping criterion, ends both sides early: transformers checks
it after every token, WeDLM decoding after every commit. No Gradio here, so the engine is testable on its own.
"""

import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import lru_cache

import torch
from transformers import (
    GenerationConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    StoppingCriteria,
    StoppingCriteriaList,
)
from transformers.generation.streamers import BaseStreamer

import wedlm_hf
from wedlm_hf.loading import load_model_and_tokenizer, pretrained_path

from .logic import DecodeParams, InputError, generate_options

SIDES = ("wedlm", "ar")
"""The `decoding=` value of each side, in the order their threads start."""


class StopFlag(StoppingCriteria):
    """Stops every row once `event` is set, so Stop (or a closed page) frees the CPU within one step."""

    def __init__(self, event: threading.Event):
        self.event = event

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor | None, **kwargs) -> torch.BoolTensor:
        return torch.full((input_ids.shape[0],), self.event.is_set(), dtype=torch.bool, device=input_ids.device)


class QueueStreamer(BaseStreamer):
    """Sends each batch of new token ids to `events` tagged with its side; `generate` first puts the prompt, skipped."""

    def __init__(self, side: str, events: queue.Queue):
        self.side = side
        self.events = events
        self.prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        self.events.put((self.side, "tokens", value.flatten().tolist()))

    def end(self) -> None:
        """Nothing to flush: the worker reports the end together with `generate`'s output."""


@dataclass
class SideProgress:
    """What one side has produced so far; `output` (generate's result) or `error` is set once it has finished."""

    token_ids: list[int] = field(default_factory=list)
    started: float = field(default_factory=time.perf_counter)
    finished: float | None = None
    output: object | None = None
    error: str | None = None

    @property
    def done(self) -> bool:
        return self.finished is not None

    @property
    def seconds(self) -> float:
        return (self.finished or time.perf_counter()) - self.started


class StopRegistry:
    """The stop flag of each browser session's running generation, so a Stop click reaches the right threads."""

    def __init__(self):
        self._lock = threading.Lock()
        self._events: dict[str, threading.Event] = {}

    def start(self, session: str) -> threading.Event:
        """A fresh flag for `session`; a generation the session still had running is told to stop."""
        event = threading.Event()
        with self._lock:
            previous = self._events.get(session)
            self._events[session] = event
        if previous is not None:
            previous.set()
        return event

    def stop(self, session: str) -> bool:
        """Set the session's flag; False when it has nothing running."""
        with self._lock:
            event = self._events.pop(session, None)
        if event is None:
            return False
        event.set()
        return True

    def finish(self, session: str, event: threading.Event) -> None:
        """Forget `event` unless the session has since started another generation."""
        with self._lock:
            if self._events.get(session) is event:
                del self._events[session]


_load_lock = threading.Lock()


@lru_cache(maxsize=2)
def _load(name: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    model, tokenizer = load_model_and_tokenizer(name)
    return wedlm_hf.enable(model), tokenizer


def load_model(name: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Model and tokenizer from a local path, Hub id or named model (`smollm2-wedlm`, ...), kept for the next
    request (two models at most)."""
    name = (name or "").strip()
    if not name:
        raise InputError("Choose a model: the embedded checkpoint, a local path or a Hub id.")
    with _load_lock:  # two sessions asking for a new model load it once
        return _load(name)


def load_generation_config(name: str) -> GenerationConfig | None:
    """The generation config of a local path or Hub id without loading its weights; None when there is none or it
    cannot be read (the page then starts from the library defaults)."""
    try:
        return GenerationConfig.from_pretrained(pretrained_path((name or "").strip()))
    except (OSError, ValueError):
        return None


def _run_side(
    model: PreTrainedModel, inputs: dict, options: dict, side: str, events: queue.Queue, stop: threading.Event
) -> None:
    try:
        output = model.generate(
            **inputs,
            **options,
            streamer=QueueStreamer(side, events),
            stopping_criteria=StoppingCriteriaList([StopFlag(stop)]),
        )
    except Exception as error:  # shown next to the side that failed; the other side goes on
        events.put((side, "error", f"{type(error).__name__}: {error}"))
    else:
        events.put((side, "done", output))


def race(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompt: str,
    params: DecodeParams,
    stop: threading.Event,
    poll_seconds: float = 0.25,
) -> Iterator[dict[str, SideProgress]]:
    """Decode `prompt` both ways at once; yield the progress of both sides after each batch of news, and at least
    every `poll_seconds` (so tokens/s keeps moving). Closing the iterator early sets `stop`, ending both threads."""
    inputs = dict(tokenizer(prompt, return_tensors="pt").to(model.device))
    inputs.pop("token_type_ids", None)  # some tokenizers return them; decoder-only models reject them
    progress = {side: SideProgress() for side in SIDES}
    events: queue.Queue = queue.Queue()
    for side in SIDES:
        options = generate_options(params, side)
        lacks_mask = getattr(model.config, "mask_token_id", None) is None
        if side == "wedlm" and lacks_mask and tokenizer.mask_token_id is not None:
            options["mask_token_id"] = tokenizer.mask_token_id  # a plain causal LM whose tokenizer has one
        thread = threading.Thread(
            target=_run_side, args=(model, inputs, options, side, events, stop), name=f"wedlm-demo-{side}", daemon=True
        )
        thread.start()
    try:
        while not all(p.done for p in progress.values()):
            try:
                item = events.get(timeout=poll_seconds)
                while True:
                    _apply(progress, *item)
                    item = events.get_nowait()
            except queue.Empty:
                pass
            yield progress
    finally:
        stop.set()


def _apply(progress: dict[str, SideProgress], side: str, kind: str, payload) -> None:
    state = progress[side]
    if kind == "tokens":
        state.token_ids.extend(payload)
        return
    state.finished = time.perf_counter()
    if kind == "done":
        state.output = payload
    else:
        state.error = payload
