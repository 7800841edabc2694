"""JSON Lines input for every command: one JSON object a line, each error naming the file and line number.

Training data, evaluation prompts and batch rows are all read this way, so a bad line is never skipped (a
silently shorter file would change results without a trace) and every message points at the line to fix.
"""

import json
from pathlib import Path


def read_objects(path: str | Path, example: str) -> list[tuple[str, dict]]:
    """`(where, object)` for each non-blank line, `where` being `file line N`; `example` shows a valid line."""
    path = Path(path).expanduser()
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise FileNotFoundError(f"{path}: {error.strerror or error}") from error
    objects = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path.name} line {number}"
        try:
            value = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{where}: not valid JSON ({error.msg}); each line is one JSON object") from error
        if not isinstance(value, dict):
            raise ValueError(f"{where}: expected a JSON object like {example}, got {type(value).__name__}")
        objects.append((where, value))
    return objects


def check_messages(messages, where: str) -> list[dict]:
    """A chat: a non-empty list of `{"role": str, "content": str}` objects."""
    if not isinstance(messages, list) or not messages or not all(_is_message(m) for m in messages):
        raise ValueError(f'{where}: `messages` must be a non-empty list of {{"role": ..., "content": ...}} objects')
    return messages


def _is_message(message) -> bool:
    return isinstance(message, dict) and isinstance(message.get("role"), str) and isinstance(message.get("content"), str)
