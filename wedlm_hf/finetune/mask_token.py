"""Give a model the `[MASK]` token WeDLM decoding feeds, and record it where decoding looks for it.

A WeDLM checkpoint already has one (`config.mask_token_id`); a tokenizer with a mask token (BERT-style) keeps its
own; `token=` names an existing token to use. Otherwise, for full fine-tuning, a new special token `<|mask|>` is
added and the embeddings grow by one row, initialised by transformers' mean resizing (the mean of the existing
rows plus a little of their covariance), so the untrained token starts as an "average" input rather than a random
vector far from every real one. A LoRA adapter must fit its base model's unchanged embeddings, so there
(`reuse=True`) the mask is an existing special token that text never contains: the last added special token that
is not BOS/EOS/PAD/UNK and does not appear in the chat template (SmolLM2: `<empty_output>`, id 16).
"""

from transformers import PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging

logger = logging.get_logger(__name__)

NEW_MASK_TOKEN = "<|mask|>"


def ensure_mask_token(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, token: str | None = None, reuse: bool = False
) -> tuple[int, bool]:
    """The mask token id, and whether the model is new to it (then its embedding row must be trained).

    The model knows its mask when its config or generation config names one (a WeDLM checkpoint, or a model an
    earlier run adapted); any other choice is new to it, a tokenizer's own `mask_token` included.
    """
    config = model.config.get_text_config()
    known = getattr(config, "mask_token_id", None)
    if known is None:
        known = getattr(model.generation_config, "mask_token_id", None)
    if known is not None:
        if not 0 <= known < model.get_input_embeddings().num_embeddings:
            raise ValueError(f"the model's mask_token_id {known} is outside its {config.vocab_size}-row embeddings")
        record_mask_token(model, known)
        return known, False
    if token is not None:
        mask_id = tokenizer.convert_tokens_to_ids(token)
        if mask_id is None or mask_id == tokenizer.unk_token_id or tokenizer.convert_ids_to_tokens(mask_id) != token:
            raise ValueError(f"--mask-token {token!r} is not a token of this tokenizer; name one of its tokens")
        tokenizer.mask_token = token
        record_mask_token(model, mask_id)
        return mask_id, True
    if tokenizer.mask_token_id is not None:
        record_mask_token(model, tokenizer.mask_token_id)
        return tokenizer.mask_token_id, True
    if reuse:
        return ensure_mask_token(model, tokenizer, token=unused_special_token(tokenizer))
    tokenizer.add_special_tokens({"mask_token": NEW_MASK_TOKEN})
    mask_id = tokenizer.mask_token_id
    if mask_id >= model.get_input_embeddings().num_embeddings:
        model.resize_token_embeddings(len(tokenizer), mean_resizing=True)
    logger.info(f"added the mask token {NEW_MASK_TOKEN!r} as id {mask_id}")
    record_mask_token(model, mask_id)
    return mask_id, True


def record_mask_token(model: PreTrainedModel, mask_id: int) -> None:
    """Write the id into the config and the generation config, the two places decoding reads it from."""
    model.config.get_text_config().mask_token_id = mask_id
    model.generation_config.mask_token_id = mask_id


def unused_special_token(tokenizer: PreTrainedTokenizerBase) -> str:
    """The last added special token that plain text and the chat template never produce (see the module doc)."""
    taken = {tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token, tokenizer.unk_token}
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else ""
    candidates = [
        added.content
        for _, added in sorted(tokenizer.added_tokens_decoder.items())
        if added.special and added.content not in taken and added.content not in template
    ]
    if not candidates:
        raise ValueError(
            "this tokenizer has no spare special token to serve as the mask for a LoRA adapter; pass --mask-token "
            "with a token that text never contains, or fine-tune fully (no --lora-r), which adds a new one"
        )
    logger.warning(f"using the unused special token {candidates[-1]!r} as the mask token")
    return candidates[-1]
