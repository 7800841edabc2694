"""The rows of a batch job: one JSON object per input line, all checked before anything is generated.

A row is `{"id"?, "prompt" | "messages", <generation override>...}`. Checking every line first means a bad line
stops the job before it writes (or overwrites) anything, with the line number in the message.
"""

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ..generation.options import ROWS, Accepts, exposed_to


@dataclass(frozen=True)
class StopStrings:
    """`stop_strings`' rule, in the shape of the options' `Accepts`: a non-empty string or list of them."""

    def __call__(self, value: object) -> bool:
        strings = [value] if isinstance(value, str) else value
        return isinstance(strings, list) and bool(strings) and all(isinstance(s, str) and s for s in strings)

    def describe(self, spelling: str = "python") -> str:
        return "a string or a list of strings"


OVERRIDES: dict[str, Accepts | StopStrings] = {
    "max_new_tokens": Accepts("int", minimum=1),
    "do_sample": Accepts("bool"),
    "temperature": Accepts("number"),
    "top_k": Accepts("int"),
    "top_p": Accepts("number"),
    "stop_strings": StopStrings(),
    **{option.keyword: option.accepts for option in exposed_to(ROWS)},
}
"""The generation keywords a row may set for itself, with what each must be."""


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
        if not OVERRIDES[key](value):
            raise RowError(f"{where}: {key!r} must be {OVERRIDES[key].describe('json')}, got {value!r}.")
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
