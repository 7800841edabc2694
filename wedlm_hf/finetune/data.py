"""Fine-tuning data: JSONL or a local `datasets` file/folder, as rows for `DualStreamCollator`.

A record has `"text"` (continued pretraining: every token is maskable and a target) or `"messages"` (a chat, read
through the tokenizer's chat template: only assistant tokens are maskable and targets, the prompt stays observed,
as decoding sees it). Text is packed into full rows of `seq_len` tokens, EOS between documents; each chat is one
row, right-padded (padding is never maskable, so it carries no loss). A chat longer than `seq_len` is an error
naming its line, never silently cut or dropped.
"""

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from ..evaluation.jsonl import check_messages, read_objects

TEXT, MESSAGES = "text", "messages"


@dataclass
class Record:
    """One input record and where it came from (1-based line or row number), for error messages."""

    where: str
    text: str | None = None
    messages: list[dict] | None = None


def read_records(source: str | Path) -> list[Record]:
    """Records of a `.jsonl` file, or of a local `datasets` file/folder (json, csv, parquet, arrow; `load_from_disk`)."""
    path = Path(source).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"--data {source}: no such file or folder")
    if path.suffix == ".jsonl":
        return [_checked(where, value) for where, value in read_objects(path, '{"text": ...} or {"messages": [...]}')]
    return [_checked(f"{path.name} row {index + 1}", dict(row)) for index, row in enumerate(_dataset(path))]


def _checked(where: str, value: dict) -> Record:
    if (TEXT in value) == (MESSAGES in value):
        raise ValueError(f"{where}: a record needs exactly one of 'text' or 'messages', got keys {sorted(value)}")
    if TEXT in value:
        if not isinstance(value[TEXT], str) or not value[TEXT]:
            raise ValueError(f"{where}: 'text' must be a non-empty string")
        return Record(where, text=value[TEXT])
    messages = check_messages(value[MESSAGES], where)
    if not any(m["role"] == "assistant" for m in messages):
        raise ValueError(f"{where}: a chat needs at least one 'assistant' message (only those tokens are trained)")
    return Record(where, messages=messages)


def _dataset(path: Path):
    try:
        import datasets
    except ImportError as error:
        raise ImportError(f"--data {path}: reading a `datasets` file or folder needs `pip install datasets`") from error
    if path.is_dir():
        loaded = datasets.load_from_disk(str(path))
        if isinstance(loaded, datasets.DatasetDict):
            if "train" not in loaded:
                raise ValueError(f"--data {path}: a DatasetDict needs a 'train' split, has {list(loaded)}")
            loaded = loaded["train"]
        return loaded
    builder = {".json": "json", ".csv": "csv", ".parquet": "parquet", ".arrow": "arrow"}.get(path.suffix)
    if builder is None:
        raise ValueError(f"--data {path}: expected .jsonl, .json, .csv, .parquet, .arrow or a saved dataset folder")
    return datasets.load_dataset(builder, data_files=str(path), split="train")


def build_rows(records: list[Record], tokenizer: PreTrainedTokenizerBase, seq_len: int) -> list[dict]:
    """Features (`input_ids`, `maskable`) of `seq_len` tokens: packed text rows, then one padded row per chat."""
    rows = pack_texts([r.text for r in records if r.text is not None], tokenizer, seq_len)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    for record in records:
        if record.messages is None:
            continue
        ids, maskable = chat_tokens(record, tokenizer)
        if len(ids) > seq_len:
            raise ValueError(
                f"{record.where}: the chat is {len(ids)} tokens, more than --seq-len {seq_len}; raise --seq-len or split it"
            )
        padding = seq_len - len(ids)
        rows.append({"input_ids": ids + [pad] * padding, "maskable": maskable + [False] * padding})
    return rows


def pack_texts(texts: list[str], tokenizer: PreTrainedTokenizerBase, seq_len: int) -> list[dict]:
    """Texts joined with EOS and cut into full rows; the ragged tail is kept as one right-padded row."""
    if not texts:
        return []
    if tokenizer.eos_token_id is None:
        raise ValueError("packing text needs an EOS token between documents; this tokenizer has none")
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    stream = [token for row in ids for token in (*row, tokenizer.eos_token_id)]
    rows = [
        {"input_ids": stream[start : start + seq_len], "maskable": [True] * seq_len}
        for start in range(0, len(stream) - seq_len + 1, seq_len)
    ]
    tail = stream[len(rows) * seq_len :]
    if tail:
        padding = seq_len - len(tail)
        rows.append({"input_ids": tail + [tokenizer.eos_token_id] * padding, "maskable": [True] * len(tail) + [False] * padding})
    return rows


def chat_tokens(record: Record, tokenizer: PreTrainedTokenizerBase) -> tuple[list[int], list[bool]]:
    """The chat's template tokens and which are assistant tokens.

    Each assistant turn is the span between the template of the messages before it (with the generation prompt)
    and the template including it, which works for any template whose renderings extend each other; a template
    that does not is an error, so no chat trains on the wrong tokens.
    """
    if tokenizer.chat_template is None:
        raise ValueError(f"{record.where}: 'messages' need a tokenizer with a chat template; this one has none")
    messages = record.messages
    ids = _template(tokenizer, messages, False)
    maskable = [False] * len(ids)
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        start = len(_template(tokenizer, messages[:index], True))
        end_ids = _template(tokenizer, messages[: index + 1], False)
        if ids[: len(end_ids)] != end_ids or start > len(end_ids):
            raise ValueError(
                f"{record.where}: this tokenizer's chat template renders a conversation differently from its prefix, "
                "so the assistant tokens cannot be found; pass the data as 'text' instead"
            )
        maskable[start : len(end_ids)] = [True] * (len(end_ids) - start)
    return ids, maskable


def _template(tokenizer: PreTrainedTokenizerBase, messages: list[dict], generation_prompt: bool) -> list[int]:
    if not messages:
        return []
    encoded = tokenizer.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=generation_prompt, return_dict=True
    )
    return list(encoded["input_ids"])


class RowDataset(torch.utils.data.Dataset):
    """A list of feature dicts as the map-style dataset `Trainer` expects."""

    def __init__(self, rows: list[dict]):
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict:
        return self.rows[index]
