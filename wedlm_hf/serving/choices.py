"""A request's choices: each of its prompts `n` times, each choice its own generation request (continuous batching
decodes them side by side), and what the response adds to each (the echoed prompt, log-probabilities).

`ResponseOptions` reads what a request asks of its response; `plan_choices` makes the choices; `ChoiceManager`
stands for the generate manager in one choice's handler call, recording its tokens, cutting its streamed text
before a stop string and scoring it. responses.py joins the choices' answers into one.
"""

import asyncio
import copy
import functools
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

from .errors import invalid_request
from .fields import end_user
from .logprobs import MAX_TOP_LOGPROBS, CompletionLogprobs, TokenLogprob, TokenScorer, chat_logprobs
from .streamers import StopTrim, TokenText

MAX_CHOICES = 128
"""The most choices a request may ask for (OpenAI's limit on `n`)."""
OPTIONS_ATTRIBUTE = "response_options"
"""Where a request's `ResponseOptions` ride on its generation config, from the handler's config to its answer."""


def _integer(body: dict, name: str, low: int, high: int, default: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise invalid_request(f"`{name}` must be an integer in [{low}, {high}], got {value!r}.", name)
    return value


@dataclass(frozen=True)
class ResponseOptions:
    """What a request asks of its response beyond one text: `n` choices per prompt, log-probabilities with `top`
    alternatives per token (`top` None: none), the prompt echoed, the usage chunk of a stream, the text cut before
    stop strings, and the API; and who the end user is, for the log."""

    chat: bool
    n: int = 1
    top: int | None = None
    echo: bool = False
    include_usage: bool = True
    stops: tuple[str, ...] = ()
    """The stop strings, which the text ends before."""
    end_user: dict = field(default_factory=dict)
    """The end-user identifiers the request names, for the server's log."""

    @classmethod
    def read(cls, body: dict, chat: bool) -> "ResponseOptions":
        """The options `body` asks for, or an HTTP 400 naming the field that cannot be served."""
        n = _integer(body, "n", 1, MAX_CHOICES, default=1)
        best_of = _integer(body, "best_of", 1, MAX_CHOICES)
        if best_of not in (None, n):
            raise invalid_request(
                f"`best_of` must equal `n` ({n}): ranking more samples than are returned is not served.", "best_of"
            )
        if chat:
            if body.get("logprobs") not in (None, True, False):
                raise invalid_request(f"`logprobs` must be true or false, got {body['logprobs']!r}.", "logprobs")
            top = _integer(body, "top_logprobs", 0, MAX_TOP_LOGPROBS)
            if top is not None and not body.get("logprobs"):
                raise invalid_request("`top_logprobs` needs `logprobs: true`.", "top_logprobs")
            top = (top or 0) if body.get("logprobs") else None
        else:
            top = _integer(body, "logprobs", 0, MAX_TOP_LOGPROBS)
        echo = body.get("echo") or False
        if not isinstance(echo, bool):
            raise invalid_request(f"`echo` must be true or false, got {echo!r}.", "echo")
        budget = next((name for name in ("max_completion_tokens", "max_tokens") if body.get(name) is not None), None)
        if budget is not None and body[budget] == 0 and not echo:
            raise invalid_request(f"`{budget}` must be at least 1 (0 only with `echo`, to score the prompt).", budget)
        return cls(chat, n, top, echo, _include_usage(body), _stops(body), end_user(body))


def _stops(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
    if not all(isinstance(one, str) and one for one in stops):
        raise invalid_request(f"`stop` must be a non-empty string or a list of them, got {stop!r}.", "stop")
    return stops


def _include_usage(body: dict) -> bool:
    options = body.get("stream_options")
    if options is None:
        return True
    if not body.get("stream"):
        raise invalid_request("`stream_options` is only for streamed requests (`stream: true`).", "stream_options")
    if not isinstance(options, dict) or set(options) - {"include_usage", "include_obfuscation"}:
        raise invalid_request(f"`stream_options` takes `include_usage`, got {options!r}.", "stream_options")
    if options.get("include_obfuscation"):
        message = "`stream_options.include_obfuscation`: the server pads no chunks; drop it."
        raise invalid_request(message, "stream_options")
    return options.get("include_usage") is not False


@dataclass
class Prompt:
    ids: list[int]
    inputs: dict
    """The generate manager's inputs for it."""
    text: str = ""
    """As `echo` repeats it."""


@dataclass
class Choice:
    index: int
    request_id: str
    prompt: Prompt
    config: GenerationConfig
    scorer: TokenScorer | None = None
    """Scores its tokens when the request asks for log-probabilities."""
    logprobs: Callable[[list[TokenLogprob]], dict] | None = None
    """Writes scored tokens in its API's `logprobs` shape (completions: offsets counting on, part after part)."""
    generated: list[int] = field(default_factory=list)

    async def prompt_scores(self) -> list[TokenLogprob]:
        """Its prompt's tokens scored (fed first: the output's are scored after them)."""
        return await self.scorer.score(self.prompt.ids)


def plan_choices(
    request_id: str,
    prompts: list[Prompt],
    config: GenerationConfig,
    options: ResponseOptions,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
) -> list[Choice]:
    """Each prompt `options.n` times, in order; a seeded request's choices of one prompt draw from seed, seed + 1,
    ... (vLLM's rule), so they differ and each is reproducible."""
    choices, count = [], len(prompts) * options.n
    for prompt in prompts:
        for sample in range(options.n):
            index = len(choices)
            choice_config = copy.deepcopy(config)
            if getattr(config, "seed", None) is not None:
                choice_config.seed = config.seed + sample
            choice = Choice(index, request_id if count == 1 else f"{request_id}-{index}", prompt, choice_config)
            if options.top is not None:
                choice.scorer = TokenScorer(model, options.top)
                choice.logprobs = (
                    functools.partial(chat_logprobs, tokenizer) if options.chat else CompletionLogprobs(tokenizer).part
                )
            choices.append(choice)
    return choices


class ChoiceManager:
    """The generate manager as one choice's handler call sees it: the tokens it generates are recorded, its stream's
    pieces come cut before a stop string and scored (`ScoredQueue`), and a choice with no budget (`max_tokens: 0`,
    to echo the prompt) generates nothing."""

    def __init__(self, manager, choice: Choice, stops: tuple[str, ...] = ()):
        self.manager, self.choice, self.stops = manager, choice, stops

    def __getattr__(self, name: str):
        return getattr(self.manager, name)

    async def generate_non_streaming(self, model, processor, inputs, gen_config, request_id):
        if gen_config.max_new_tokens == 0:
            return "", len(self.choice.prompt.ids), []
        text, prompt_length, generated = await self.manager.generate_non_streaming(
            model, processor, inputs, gen_config, request_id
        )
        self.choice.generated = generated.tolist() if hasattr(generated, "tolist") else list(generated)
        return text, prompt_length, generated

    def generate_streaming(self, model, processor, inputs, gen_config, request_id, response_parser=None):
        if gen_config.max_new_tokens == 0:
            nothing = asyncio.Queue()
            nothing.put_nowait(None)
            return ScoredQueue(nothing, None), NoStream()
        queue, streamer = self.manager.generate_streaming(
            model, processor, inputs, gen_config, request_id, response_parser=response_parser
        )
        return ScoredQueue(queue, self.choice, self.stops), streamer


class NoStream:
    """The streamer of a choice that generates nothing."""

    total_tokens = 0

    def cancel(self) -> None:
        pass


class ScoredQueue:
    """A stream's queue as its choice hands it out: text cut before a stop string, and each piece with its tokens'
    `logprobs` when the choice asks for them (one piece per `get`: scoring awaits the scoring thread). Pieces left
    with no text are dropped, unless their tokens are scored."""

    def __init__(self, queue: asyncio.Queue, choice: Choice | None, stops: tuple[str, ...] = ()):
        self.queue, self.choice = queue, choice
        self.trim = StopTrim(stops) if stops else None
        self.ready: deque = deque()

    @property
    def scoring(self) -> bool:
        return self.choice is not None and self.choice.scorer is not None

    async def get(self):
        while not self.ready:
            self._take(await self.queue.get())
        item = self.ready.popleft()
        if isinstance(item, TokenText) and self.scoring:
            item.logprobs = self.choice.logprobs(await self.choice.scorer.score(item.token_ids))
        return item

    def get_nowait(self):
        if self.scoring:
            raise asyncio.QueueEmpty
        while not self.ready:
            self._take(self.queue.get_nowait())
        return self.ready.popleft()

    def _take(self, item) -> None:
        if not isinstance(item, TokenText):
            rest = self.trim.rest() if item is None and self.trim is not None else ""
            self.ready.extend([rest, item] if rest else [item])
            return
        piece = self.trim.feed(item) if self.trim is not None else item
        if piece or (self.scoring and piece.token_ids):
            self.ready.append(piece)
