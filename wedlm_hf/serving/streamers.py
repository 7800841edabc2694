"""Streamed text that knows its tokens. transformers serve's streamers decode tokens to text pieces for the
handlers to send; OpenAI's streamed `logprobs` belong to the chunk whose text they score, so each piece here
carries the ids of the tokens decoded since the piece before (`TokenText`, still a `str` to every handler).
Tokens that decode to nothing yet (part of a character, a special token the output leaves out) ride on the next
piece, or on an empty one right before the stream ends.
"""

import asyncio

from transformers.cli.serving import utils as serving_utils


class TokenText(str):
    """A piece of streamed text and the tokens it was decoded from; `logprobs` is set once they are scored."""

    token_ids: list[int]
    logprobs = None

    def __new__(cls, text: str, token_ids: list[int]):
        piece = super().__new__(cls, text)
        piece.token_ids = token_ids
        return piece


class TokenLabels:
    """The tokens a streamer decoded since it last handed out plain text, given to the next piece as labels."""

    def __init__(self):
        self.pending: list[int] = []

    def label(self, item):
        """`item` (a streamer's queue item), plain text labelled with the pending tokens; before the end-of-stream
        marker (None), the tokens left, on an empty piece."""
        if type(item) is str:
            item, self.pending = TokenText(item, self.pending), []
        elif item is None and self.pending:
            return [TokenText("", self.pending), None]
        return [item]


class LabelledQueue(asyncio.Queue):
    """The queue of a continuous-batching stream (its `CBStreamer` puts on the event loop, one token at a time)."""

    def __init__(self):
        super().__init__()
        self.labels = TokenLabels()

    def put_nowait(self, item) -> None:
        for labelled in self.labels.label(item):
            super().put_nowait(labelled)


class LabellingDirectStreamer(serving_utils.DirectStreamer):
    """transformers' streamer for `generate()` (which puts on the inference thread), labelling as it enqueues."""

    def __init__(self, *args, **kwargs):
        self.labels = TokenLabels()
        super().__init__(*args, **kwargs)

    def put(self, value) -> None:
        if self._first:  # the prompt
            super().put(value)
            return
        for token in value.reshape(-1):
            self.labels.pending.append(int(token))
            super().put(token[None])

    def _enqueue(self, item) -> None:
        for labelled in self.labels.label(item):
            super()._enqueue(labelled)


class StopTrim:
    """Text cut before the first stop string, as OpenAI's `stop` returns it (decoding ends with the string, which
    the engine keeps: `usage` and `logprobs` count its tokens). Streamed, the last characters that may start one
    are held back until the text goes on or ends; pieces after the stop string lose their text, not their tokens."""

    def __init__(self, stops: tuple[str, ...]):
        self.stops, self.hold = stops, max(map(len, stops)) - 1
        self.held, self.stopped = "", False

    def cut(self, text: str) -> tuple[str, bool]:
        """`text` up to its first stop string, and whether it had one."""
        found = [text.find(stop) for stop in self.stops if stop in text]
        return (text[: min(found)], True) if found else (text, False)

    def feed(self, piece: TokenText) -> TokenText:
        """What of the text so far can go out with `piece`'s tokens."""
        if self.stopped:
            return TokenText("", piece.token_ids)
        text, self.stopped = self.cut(self.held + piece)
        keep = len(text) if self.stopped else max(len(text) - self.hold, 0)
        self.held = text[keep:]
        return TokenText(text[:keep], piece.token_ids)

    def rest(self) -> TokenText:
        """The held text, at the end of the stream."""
        held, self.held = self.held, ""
        return TokenText(held, [])
