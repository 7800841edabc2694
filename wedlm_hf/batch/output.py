"""The output JSONL file as a journal: appended batch by batch, read back on `--resume`, sorted when complete.

Every batch's lines go out in one write and are flushed, so a killed run loses at most the batches in flight.
A line cut short by the kill (no newline, not valid JSON) is dropped on resume; the rows it held run again.
When every row is done, the file is rewritten in input order (to a temporary file, then renamed).
"""

import json
import os
from pathlib import Path

from .rows import PromptRow, RowError


def done_ids(path: str | Path) -> set[str]:
    """JSON-encoded ids of the rows already in `path` (empty if it does not exist); drops a torn last line."""
    if not os.path.exists(path):
        return set()
    with open(path, "rb") as file:
        data = file.read()
    lines = data.split(b"\n")
    if lines[-1]:  # the last write was cut short: forget it, its rows are generated again
        with open(path, "r+b") as file:
            file.truncate(len(data) - len(lines[-1]))
    ids = set()
    for number, line in enumerate(lines[:-1], start=1):
        if not line.strip():
            continue
        try:
            result = json.loads(line)
            ids.add(json.dumps(result["id"]))
        except (json.JSONDecodeError, UnicodeDecodeError, TypeError, KeyError):
            raise RowError(
                f"{path} line {number}: not a result line of `wedlm-hf generate --input` (a JSON object with an "
                "\"id\"); cannot resume from this file."
            ) from None
    return ids


def append_results(path: str | Path, results: list[dict]) -> None:
    """Append one JSON line per result, in a single flushed write."""
    if not results:
        return
    text = "".join(json.dumps(result, ensure_ascii=False) + "\n" for result in results)
    with open(path, "a", encoding="utf-8") as file:
        file.write(text)
        file.flush()


def sort_output(path: str | Path, rows: list[PromptRow]) -> None:
    """Rewrite `path` in the order of `rows` (atomically: a temporary file renamed over it)."""
    order = {json.dumps(row.id): row.index for row in rows}
    with open(path, encoding="utf-8") as file:
        lines = [line for line in file if line.strip()]
    lines.sort(key=lambda line: order.get(json.dumps(json.loads(line)["id"]), len(order)))
    temporary = f"{path}.sorting"
    with open(temporary, "w", encoding="utf-8") as file:
        file.writelines(lines)
    os.replace(temporary, path)
