"""The OpenAI API over one model and its engine: `/v1/completions`, `/v1/chat/completions` (the tokenizer's chat
template), `/v1/models` and `/health`. A completion is answered whole, or streamed as server-sent events: its text
as it is decoded, then a last chunk with the finish reason and the usage, then `[DONE]`."""

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Protocol

from fastapi import FastAPI
from fastapi.responses import JSONResponse, StreamingResponse
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .errors import add_error_handlers, error_event, invalid_request
from .managers import Engine, Job
from .requests import CHAT_FIELDS, COMPLETION_FIELDS, check_fields, request_config


class Served(Protocol):
    """What the endpoints answer with (a `server.Server`)."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    name: str
    """The model id clients send, `/v1/models` lists and responses name."""
    engine: Engine
    created: int


class Completions:
    """How `/v1/completions` writes its answer: the text that continues the prompt."""

    prefix, whole_object, chunk_object = "cmpl", "text_completion", "text_completion"
    opening: tuple[dict, ...] = ()
    """The choices streamed before the first token."""

    @staticmethod
    def choice(text: str, finish_reason: str | None) -> dict:
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}

    chunk_choice = choice


class ChatCompletions:
    """How `/v1/chat/completions` writes its answer: the assistant's message; streamed, its role first."""

    prefix, whole_object, chunk_object = "chatcmpl", "chat.completion", "chat.completion.chunk"
    opening = ({"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None},)

    @staticmethod
    def choice(text: str, finish_reason: str) -> dict:
        return {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish_reason}

    @staticmethod
    def chunk_choice(text: str, finish_reason: str | None) -> dict:
        return {"index": 0, "delta": {"content": text} if text else {}, "finish_reason": finish_reason}


Endpoint = type[Completions] | type[ChatCompletions]


def build_app(server: Served) -> FastAPI:
    """The server's FastAPI app."""
    app = FastAPI(title="wedlm-hf serve")
    add_error_handlers(app)

    @app.post("/v1/completions")
    async def completions(body: dict):
        check_fields(body, COMPLETION_FIELDS)
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise invalid_request("`prompt` must be a string.", "prompt")
        encoded = await asyncio.to_thread(server.tokenizer, prompt)
        return await answer(server, body, encoded["input_ids"], Completions)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: dict):
        check_fields(body, CHAT_FIELDS)
        input_ids = await asyncio.to_thread(chat_prompt, server.tokenizer, body)
        return await answer(server, body, input_ids, ChatCompletions)

    @app.get("/v1/models")
    async def models():
        listed = {"id": server.name, "object": "model", "created": server.created, "owned_by": "wedlm-hf"}
        return {"object": "list", "data": [listed]}

    @app.get("/health")
    async def health():
        if server.engine.is_alive():
            return {"status": "ok"}
        return JSONResponse({"status": "unhealthy", "reason": "the decoding engine has stopped"}, status_code=503)

    return app


def chat_prompt(tokenizer: PreTrainedTokenizerBase, body: dict) -> list[int]:
    """The tokens of `body`'s messages through the tokenizer's chat template, ready for the assistant's answer."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not all(isinstance(message, dict) for message in messages):
        raise invalid_request("`messages` must be a list of messages.", "messages")
    template_options = body.get("chat_template_kwargs") or {}
    if not isinstance(template_options, dict):
        raise invalid_request("`chat_template_kwargs` must be an object.", "chat_template_kwargs")
    if tokenizer.chat_template is None:
        raise invalid_request("This model's tokenizer has no chat template: send a prompt to /v1/completions.")
    encoded = tokenizer.apply_chat_template(
        [{**message, "content": _text(message.get("content"))} for message in messages],
        add_generation_prompt=True, tokenize=True, return_dict=True, **template_options,
    )
    return list(encoded["input_ids"])


def _text(content: object) -> str:
    """A message's content as text: a string, or a list of text parts (this server reads no other kind)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(part, dict) and part.get("type") == "text" for part in content):
        return "".join(str(part.get("text", "")) for part in content)
    raise invalid_request("A message's `content` must be a string or a list of text parts.", "messages")


async def answer(server: Served, body: dict, input_ids: list[int], endpoint: Endpoint):
    """Decode `input_ids` as `body` asks, and answer with `endpoint`'s shape."""
    if body.get("model") not in (None, server.name):
        raise invalid_request(f"Server is pinned to '{server.name}'; requested '{body['model']}'.", "model")
    if not input_ids:
        raise invalid_request("The prompt is empty: decoding needs at least one prompt token.", "prompt")
    config = request_config(body, server.model.generation_config)
    if config.max_new_tokens is None:  # as many as fit
        config.max_new_tokens = max(server.engine.max_sequence_length - len(input_ids), 1)
    job = Job(f"{endpoint.prefix}-{uuid.uuid4().hex}", input_ids, config, bool(body.get("stream")))
    server.engine.submit(job)
    if job.stream:
        return StreamingResponse(_events(server, job, endpoint), media_type="text/event-stream")
    try:
        tokens, finish_reason = await _collect(job)
    except asyncio.CancelledError:  # the client went away
        server.engine.cancel(job.request_id)
        raise
    text = server.tokenizer.decode(tokens, skip_special_tokens=True)
    choice = endpoint.choice(text, finish_reason)
    return _reply(job, server.name, endpoint.whole_object, choice, _usage(job, len(tokens)))


async def _collect(job: Job) -> tuple[list[int], str]:
    """The request's tokens and finish reason, once it ends; raises the error that ended it."""
    tokens = []
    while isinstance(output := await job.outputs.get(), list):
        tokens += output
    if isinstance(output, BaseException):
        raise output
    return tokens, output


async def _events(server: Served, job: Job, endpoint: Endpoint) -> AsyncIterator[str]:
    """The request's answer as server-sent events; a client that leaves cancels the request."""
    text, count, ended = TextDelta(server.tokenizer), 0, False

    def event(choice: dict, usage: dict | None = None) -> str:
        return f"data: {json.dumps(_reply(job, server.name, endpoint.chunk_object, choice, usage))}\n\n"

    try:
        for choice in endpoint.opening:
            yield event(choice)
        while isinstance(output := await job.outputs.get(), list):
            count += len(output)
            if delta := text.add(output):
                yield event(endpoint.chunk_choice(delta, None))
        ended = True
        if isinstance(output, BaseException):
            yield error_event(output)
            return
        if rest := text.rest():
            yield event(endpoint.chunk_choice(rest, None))
        yield event(endpoint.chunk_choice("", output), _usage(job, count))
        yield "data: [DONE]\n\n"
    finally:
        if not ended:
            server.engine.cancel(job.request_id)


def _reply(job: Job, name: str, kind: str, choice: dict, usage: dict | None) -> dict:
    reply = {"id": job.request_id, "object": kind, "created": job.created, "model": name, "choices": [choice]}
    return reply if usage is None else {**reply, "usage": usage}


def _usage(job: Job, completion_tokens: int) -> dict:
    prompt_tokens = len(job.input_ids)
    return {
        "prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


class TextDelta:
    """The text a stream's new tokens add, decoded together with the tokens before them (alone, a token can
    decode differently: its leading space, half of a multi-byte character), and held back while it ends in an
    incomplete character."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase):
        self.tokenizer = tokenizer
        self.tokens: list[int] = []
        self.context = self.written = 0
        """`tokens[context:written]` were written already: the text decoded after them is what is new."""

    def add(self, tokens: list[int]) -> str:
        self.tokens += tokens
        return self._advance(final=False)

    def rest(self) -> str:
        """What is still held back, once the stream ends."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        before = self.tokenizer.decode(self.tokens[self.context : self.written], skip_special_tokens=True)
        text = self.tokenizer.decode(self.tokens[self.context :], skip_special_tokens=True)
        if len(text) <= len(before) or (text.endswith("\ufffd") and not final):
            return ""
        self.context, self.written = self.written, len(self.tokens)
        return text[len(before) :]
