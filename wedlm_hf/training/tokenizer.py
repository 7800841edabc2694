"""Byte-level BPE tokenizer for the embedded checkpoint, trained with the `tokenizers` library.

Digits are split one per token before BPE: counting and arithmetic then become per-digit patterns (copy the
leading digits, step the last one), which a tiny model learns from far less data than one token per number.
"""

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
MASK_TOKEN = "<|mask|>"
SPECIAL_TOKENS = [EOS_TOKEN, PAD_TOKEN, MASK_TOKEN]
CHAT_TEMPLATE = "{#- The toy model saw raw Python source only: a chat is its messages' text, one per line. -#}\n{%- for message in messages -%}{%- if not loop.first %}{{ '\\n' }}{% endif -%}{{ message['content'] }}{%- endfor -%}"
"""The model sees raw text only, so a chat is its messages' text, one per line: `pipeline` chat then just works."""


def train_tokenizer(texts: Iterable[str], vocab_size: int = 2048) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on `texts` and wrap it as a `PreTrainedTokenizerFast` (EOS, pad and mask set; left
    padding and a chat template, so batched and chat generation need no set-up)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        mask_token=MASK_TOKEN,
        padding_side="left",
        chat_template=CHAT_TEMPLATE,
    )
