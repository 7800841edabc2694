"""Prompt sets: held-out Python stdlib code, counting sequences, input-grounded edit requests on held-out
functions, held-out code seen before with small edits, a user's JSONL file, or random ids.

The embedded checkpoint is trained on stdlib files, so code prompts must come from files it never saw. The split
is declared here, the lower of the two packages that read it: `stdlib_files("eval")` gives the prompts,
`wedlm_hf.training.corpus` trains on `stdlib_files("train")`.
"""

import hashlib
import json
import re
import sysconfig
import zlib
from pathlib import Path

import torch

PROMPT_SETS = ("code", "counting", "grounded")
"""The sets a bench runs by default ("repeated" runs when named)."""
HELD_OUT_PERCENT = 5
_SKIPPED_DIRS = {"test", "tests", "idle_test", "site-packages", "__pycache__"}


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(split: str) -> list[Path]:
    """Sorted stdlib *.py files of `split` ("train" or "eval"); ~5% by SHA-256 of the relative path are "eval", so
    the held-out files are the same on every run and machine with the same Python."""
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    root = stdlib_root()
    chosen = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        if _SKIPPED_DIRS.intersection(relative.parts):
            continue
        held_out = int(hashlib.sha256(relative.as_posix().encode()).hexdigest(), 16) % 100 < HELD_OUT_PERCENT
        if held_out == (split == "eval"):
            chosen.append(path)
    return chosen


def code_prompts(count: int, max_chars: int = 600) -> list[str]:
    """The opening of the first function or class of each held-out stdlib file, cut at a line end."""
    prompts = []
    for path in stdlib_files("eval"):
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)
        start = next((i for i, line in enumerate(lines) if line.startswith(("def ", "class "))), None)
        if start is None:
            continue
        text = ""
        for line in lines[start:]:
            if len(text) + len(line) > max_chars:
                break
            text += line
        if text:
            prompts.append(text)
        if len(prompts) == count:
            break
    return prompts


def held_out_functions(count: int, max_chars: int = 900) -> list[str]:
    """The first whole top-level function of each held-out stdlib file that has one of at most `max_chars`."""
    functions = []
    for path in stdlib_files("eval"):
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)
        for start, line in enumerate(lines):
            if not line.startswith("def "):
                continue
            end = next((i for i in range(start + 1, len(lines)) if lines[i].strip() and not lines[i][0].isspace()),
                       len(lines))
            text = "".join(lines[start:end]).rstrip() + "\n"
            if len(text) <= max_chars:
                functions.append(text)
                break
        if len(functions) == count:
            break
    return functions


GROUNDED_REQUESTS = (
    "Add a docstring to this function. Reply with the whole function.",
    "Rename the function to `helper` and keep everything else. Reply with the whole function.",
    "Reformat this function with double quotes for every string. Reply with the whole function.",
)
"""Edit, document and reformat requests: most of each answer copies the quoted function (prompt lookup's case)."""


def grounded_prompts(count: int, tokenizer=None) -> list[str]:
    """Requests to edit a held-out function, quoted in the prompt: through the tokenizer's chat template when it
    has one (an instruct model), else as a code comment followed by the start of the answer."""
    prompts = []
    for index, function in enumerate(held_out_functions(count)):
        request = GROUNDED_REQUESTS[index % len(GROUNDED_REQUESTS)]
        if getattr(tokenizer, "chat_template", None):
            messages = [{"role": "user", "content": f"{request}\n\n```python\n{function}```"}]
            prompts.append(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
        else:
            prompts.append(f"# {request}\n{function}\n# The whole function, edited:\n")
    return prompts


def counting_prompts(count: int, shown: int = 8) -> list[str]:
    """Comma-separated runs of consecutive integers from spread-out starts: the most predictable continuations."""
    return [", ".join(str(n) for n in range(start, start + shown)) + ", " for start in range(1, 97 * count, 97)]


def edited(text: str, index: int) -> str:
    """A small edit of a prompt: its first function renamed and its one-digit numbers changed."""
    text = re.sub(r"def (\w+)", lambda match: f"def {match.group(1)}_v{index}", text, count=1)
    return re.sub(r"\b\d\b", lambda match: str((int(match.group(0)) + 3) % 10), text)


def repeated_prompts(count: int) -> tuple[list[str], list[str]]:
    """(seen before, asked now): held-out code prompts, then each again with a small edit, as a server sees a
    workload that repeats itself; only `draft_history` can draft from the first ones."""
    originals = code_prompts(count)
    return originals, [edited(text, index) for index, text in enumerate(originals)]


def jsonl_prompts(path: str | Path, count: int | None = None) -> list[str]:
    """`{"prompt": ...}` per line."""
    lines = [line for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    return [json.loads(line)["prompt"] for line in lines][:count]


def random_prompts(count: int, length: int, vocab_size: int, seed: int = 0) -> list[list[int]]:
    """Random id prompts for a random model, avoiding pad/BOS/EOS (ids < 3) and the mask id (the last)."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab_size - 1, (length,), generator=generator).tolist() for _ in range(count)]


def load_prompt_set(name: str, count: int, tokenizer=None, vocab_size: int | None = None) -> list[list[int]]:
    """Token ids of the prompt set `name` ("code", "counting", "grounded", "repeated" or a .jsonl path); random ids
    without a tokenizer."""
    if tokenizer is None:
        return random_prompts(count, 32, vocab_size, seed=zlib.crc32(name.encode()))
    if name == "repeated":
        texts = repeated_prompts(count)[1]
    elif name == "code":
        texts = code_prompts(count)
    elif name == "counting":
        texts = counting_prompts(count)
    elif name == "grounded":
        texts = grounded_prompts(count, tokenizer)
    else:
        texts = jsonl_prompts(name, count)
    return [tokenizer(text)["input_ids"] for text in texts]


def primed_prompts(name: str, count: int, tokenizer=None) -> list[list[int]]:
    """Token ids of what a server answered before the set `name`: the originals of "repeated", else nothing."""
    if tokenizer is None or name != "repeated":
        return []
    return [tokenizer(text)["input_ids"] for text in repeated_prompts(count)[0]]
