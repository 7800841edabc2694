"""The rows of a batch job: one JSON object per input line, all checked before anything is generated.

A row is `{"id"?, "prompt" | "messages", <generation override>...}`. Checking every line first means a bad line
stops the job before it writes (or overwrites) anything, with the line number in the message.
"""

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from numbers import Real
from pathlib import Path

from ..generation.options import OPTIONS

OVERRIDES: dict[str, str] = {
    "max_new_tokens": "an integer > 0",
    "do_sample": "true or false",
    "temperature": "a number",
    "top_k": "an integer",
    "top_p": "a number",
    "stop_strings": "a string or a list of strings",
    **{option.keyword: option.accepts for option in OPTIONS if option.in_rows},
}
"""The generation keywords a row may set for itself, with the JSON type each takes."""


class RowError(ValueError):
    """A row that cannot be generated; the message starts with where it is (`line N` of the file, or `row N`)."""


@dataclass(frozen=True)
class PromptRow:
    index: int
    """Position in the input: results are returned (and the output file finally sorted) in this order."""
    id: str | int
    where: str
    """`line N` for a file, `row N` for a Python list; starts every error message about this row."""
    prompt: str | None = None
    messages: list | None = None
    overrides: dict = field(default_factory=dict)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


_TYPE_CHECKS = {
    "an integer > 0": lambda v: _is_int(v) and v > 0,
    "true or false": lambda v: isinstance(v, bool),
    "a number": _is_number,
    "an integer": _is_int,
    "a string or a list of strings": lambda v: (isinstance(v, str) and bool(v))
    or (isinstance(v, list) and bool(v) and all(isinstance(s, str) and s for s in v)),
    "an integer >= 1": lambda v: _is_int(v) and v >= 1,
    "a number >= 0 or null": lambda v: v is None or (_is_number(v) and v >= 0),
    "a number >= 0": lambda v: _is_number(v) and v >= 0,
}


def parse_row(item: dict | str, index: int, where: str, default_id: str | int) -> PromptRow:
    """One input item (a JSON object, or a bare string meaning a prompt) as a checked `PromptRow`."""
    if isinstance(item, str):
        item = {"prompt": item}
    if not isinstance(item, dict):
        raise RowError(f"{where}: expected a JSON object, got {type(item).__name__}.")
    item = dict(item)
    row_id = item.pop("id", default_id)
    if not (isinstance(row_id, str) or _is_int(row_id)):
        raise RowError(f'{where}: "id" must be a string or an integer, got {row_id!r}.')
    prompt, messages = item.pop("prompt", None), item.pop("messages", None)
    if (prompt is None) == (messages is None):
        raise RowError(f'{where}: give exactly one of "prompt" (a string) or "messages" (a chat).')
    if prompt is not None and not (isinstance(prompt, str) and prompt):
        raise RowError(f'{where}: "prompt" must be a non-empty string.')
    if messages is not None and not (
        isinstance(messages, list)
        and messages
        and all(isinstance(m, dict) and isinstance(m.get("role"), str) and "content" in m for m in messages)
    ):
        raise RowError(f'{where}: "messages" must be a non-empty list of {{"role": ..., "content": ...}} objects.')
    for key, value in item.items():
        if key not in OVERRIDES:
            raise RowError(
                f"{where}: unknown key {key!r}. A row takes \"id\", \"prompt\" or \"messages\", and these generation "
                f"overrides: {', '.join(OVERRIDES)}."
            )
        if not _TYPE_CHECKS[OVERRIDES[key]](value):
            raise RowError(f"{where}: {key!r} must be {OVERRIDES[key]}, got {value!r}.")
    return PromptRow(index=index, id=row_id, where=where, prompt=prompt, messages=messages, overrides=item)


def _check_unique_ids(rows: list[PromptRow]) -> list[PromptRow]:
    seen: dict[str, str] = {}
    for row in rows:
        key = json.dumps(row.id)
        if key in seen:
            raise RowError(f"{row.where}: id {row.id!r} already used at {seen[key]}; ids must be unique (resume uses them).")
        seen[key] = row.where
    return rows


def rows_from_items(items: Iterable[dict | str]) -> list[PromptRow]:
    """Rows of a Python list; a row without an "id" gets its position."""
    return _check_unique_ids([parse_row(item, i, f"row {i}", i) for i, item in enumerate(items)])


def read_rows(path: str | Path) -> list[PromptRow]:
    """Rows of a JSONL file (blank lines skipped); a row without an "id" gets its 1-based line number."""
    rows = []
    with open(path, encoding="utf-8") as file:
        for number, line in enumerate(file, start=1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as error:
                raise RowError(f"{path} line {number}: not valid JSON ({error.msg} at column {error.colno}).") from None
            rows.append(parse_row(item, len(rows), f"{path} line {number}", number))
    return _check_unique_ids(rows)
