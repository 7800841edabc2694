"""One OpenAI response from a request's choices (choices.py), each answered by transformers' handler as a request
of its own: the choices indexed in order under the request's id, their text cut before a stop string, the usage
summed (each prompt counted once), and streamed, the choices' chunks interleaved as they come, with one usage
chunk at the end (unless `stream_options` turns it off). An error event from any choice ends the stream.
"""

import asyncio
import json
from collections.abc import AsyncIterator, Callable

from .choices import Choice, ResponseOptions
from .logprobs import TokenLogprob
from .streamers import StopTrim


async def joined_response(request_id: str, choices: list[Choice], answer: Callable, options: ResponseOptions) -> dict:
    """The response body for `choices`; `answer(choice)` is transformers' JSON response for one."""
    responses = await _all(answer(choice) for choice in choices)
    bodies = [json.loads(response.body) for response in responses]
    response = {**bodies[0], "id": request_id, "choices": []}
    for choice, body in zip(choices, bodies):
        (answered,) = body["choices"]
        answered["index"] = choice.index
        if options.stops:  # the text ends before the stop string (OpenAI's), which decoding ended with
            owner, key = (answered["message"], "content") if options.chat else (answered, "text")
            if owner.get(key):
                owner[key] = StopTrim(options.stops).cut(owner[key])[0]
        prompt_scores = await choice.prompt_scores() if choice.scorer is not None else []
        if options.echo:
            answered["text"] = choice.prompt.text + answered["text"]
        if choice.scorer is not None:
            scored = (prompt_scores if options.echo else []) + await choice.scorer.score(choice.generated)
            answered["logprobs"] = choice.logprobs(scored)
        response["choices"].append(answered)
    if "usage" in response:
        response["usage"] = _usage(choices, [body["usage"] for body in bodies])
    return response


async def _all(calls) -> list:
    """Await every call; the first failure cancels the others (their requests leave the batch) and is raised."""
    tasks = [asyncio.ensure_future(call) for call in calls]
    try:
        return await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()


def _usage(choices: list[Choice], usages: list[dict]) -> dict:
    prompts = {id(choice.prompt): usage["prompt_tokens"] for choice, usage in zip(choices, usages)}
    prompt_tokens, completion_tokens = sum(prompts.values()), sum(usage["completion_tokens"] for usage in usages)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


async def merged_stream(
    request_id: str,
    choices: list[Choice],
    start: Callable,
    echo: Callable[[Choice, list[TokenLogprob]], str] | None,
    options: ResponseOptions,
) -> AsyncIterator[str]:
    """The events of one stream for `choices`: `start(choice)` is transformers' streaming response for one (its
    request starts decoding at once), `echo(choice, prompt_scores)` the chunk that repeats its prompt."""
    events: asyncio.Queue = asyncio.Queue()
    pumps = [asyncio.ensure_future(_pump(choice, start(choice), echo, events)) for choice in choices]
    usages, last, running = {}, None, len(pumps)
    try:
        while running:
            choice, event = await events.get()
            if event is None:
                running -= 1
                continue
            if isinstance(event, BaseException):
                raise event
            data = json.loads(event.removeprefix("data: "))
            if "error" in data:
                yield f"{event}\n\n"
                return
            data["id"] = request_id
            for answered in data.get("choices", []):
                answered["index"] = choice.index
            usage = data.pop("usage", None)
            if usage is not None:
                usages[choice.index] = usage
            last = data
            if data.get("choices"):
                yield f"data: {json.dumps(data)}\n\n"
        if options.include_usage and last is not None and len(usages) == len(choices):
            usage = _usage(choices, [usages[choice.index] for choice in choices])
            yield f"data: {json.dumps({**last, 'choices': [], 'usage': usage})}\n\n"
    finally:
        for pump in pumps:
            pump.cancel()


async def _pump(choice: Choice, response, echo: Callable | None, events: asyncio.Queue) -> None:
    """Put `choice`'s events on `events` one by one, then None (or the exception that ended them); closing its
    response's events when cancelled cancels its request."""
    body = response.body_iterator
    try:
        if choice.scorer is not None:
            prompt_scores = await choice.prompt_scores()
            if echo is not None:
                events.put_nowait((choice, echo(choice, prompt_scores).removesuffix("\n\n")))
        elif echo is not None:
            events.put_nowait((choice, echo(choice, []).removesuffix("\n\n")))
        async for chunk in body:
            for event in chunk.split("\n\n"):
                if event.strip():
                    events.put_nowait((choice, event))
        events.put_nowait((choice, None))
    except asyncio.CancelledError:
        raise
    except Exception as error:
        events.put_nowait((choice, error))
    finally:
        await body.aclose()
