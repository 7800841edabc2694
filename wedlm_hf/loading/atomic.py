"""Folders written whole or not at all: copies under the temp dir that concurrent processes (test workers, serve's
loader) may read while another process writes them."""

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from transformers import PreTrainedModel, PreTrainedTokenizerBase


def save_atomically(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, target: Path) -> None:
    """Write `model` and `tokenizer` to `target` (see `write_atomically`)."""
    write_atomically(target, lambda partial: (model.save_pretrained(partial), tokenizer.save_pretrained(partial)))


def write_atomically(target: Path, write: Callable[[Path], object]) -> None:
    """`write` a folder into a temporary sibling of `target`, then rename it into place."""
    partial = Path(tempfile.mkdtemp(prefix=target.name + ".partial-", dir=target.parent))
    write(partial)
    try:
        os.rename(partial, target)
    except OSError:  # another process finished first
        shutil.rmtree(partial)
