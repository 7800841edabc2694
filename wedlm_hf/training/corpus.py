"""Training text available on every machine: the Python standard library's sources plus generated sequences.

The stdlib files (no test suites, no site-packages) are split by a hash of their relative path in
`wedlm_hf.bench.prompts.stdlib_files`, which the held-out prompts read too. The generated documents (counting,
arithmetic sequences, repeated lists) are the low-entropy regime where WeDLM commits many tokens per forward.
"""

import random
from collections.abc import Iterator

import torch
from transformers import PreTrainedTokenizerBase

from ..bench.prompts import stdlib_files

_WORDS = (
    "alpha beta gamma delta red green blue cat dog fox apple pear plum north south east west one two three "
    "foo bar baz spam eggs ham x y z left right up down"
).split()


def read_stdlib(split: str, max_chars: int, seed: int) -> list[str]:
    """Texts of `split` files in a seeded shuffled order, up to about `max_chars` characters in all."""
    files = stdlib_files(split)
    random.Random(seed).shuffle(files)
    texts, total = [], 0
    for path in files:
        if total >= max_chars:
            break
        text = path.read_text(encoding="utf-8", errors="replace")
        texts.append(text)
        total += len(text)
    return texts


def low_entropy_document(rng: random.Random) -> str:
    """One generated document: counting, an arithmetic sequence or a repeated list, in a random layout."""
    kind = rng.choice(("count", "count", "arithmetic", "repeat"))
    separator = rng.choice((", ", " ", "\n", ",\n"))
    if kind == "repeat":
        items = rng.sample(_WORDS, rng.randint(2, 6))
        body = separator.join(items * rng.randint(3, 12))
    else:
        start = rng.choice((0, 1, 1, rng.randint(0, 999)))
        step = 1 if kind == "count" else rng.choice((-1, 2, 3, 5, 10, rng.randint(2, 50)))
        body = separator.join(str(start + step * i) for i in range(rng.randint(10, 120)))
    layout = rng.random()
    if layout < 0.2:
        return f"{rng.choice(_WORDS)} = [{body}]\n"
    if layout < 0.3:
        return f"# {body}\n"
    return body + "\n"


def low_entropy_documents(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [low_entropy_document(rng) for _ in range(count)]


def pack(texts: list[str], tokenizer: PreTrainedTokenizerBase, length: int) -> torch.Tensor:
    """Tokenize `texts`, join them with EOS and cut the stream into (n, length) rows; the ragged tail is dropped."""
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    stream = [token for row in ids for token in (*row, tokenizer.eos_token_id)]
    rows = len(stream) // length
    return torch.tensor(stream[: rows * length], dtype=torch.long).view(rows, length)


def training_rows(
    code: torch.Tensor, generated: torch.Tensor, count: int, low_entropy_share: float, seed: int
) -> Iterator[torch.Tensor]:
    """`count` rows drawn (seeded) from the code rows, or the generated rows with probability `low_entropy_share`."""
    generator = torch.Generator().manual_seed(seed)
    for _ in range(count):
        source = generated if torch.rand((), generator=generator) < low_entropy_share else code
        yield source[torch.randint(len(source), (), generator=generator)]
