"""Cache-free reference of WeDLM decoding: the test oracle and the `nocache` benchmark arm.

Deliberately naive and independent of `decoding.py`: one prompt at a time, Python lists for state, and every
step re-runs the whole sequence (committed tokens, then filled slots, then mask slots, each at its logical
position) with no cache, which is the cost model of the authors' own HF interface. Greedy only.
"""

import math

import torch
from transformers import PreTrainedModel


@torch.no_grad()
def reference_decode(
    model: PreTrainedModel,
    prompt: list[int],
    max_new_tokens: int,
    mask_token_id: int,
    eos_token_ids: list[int] = (),
    window_size: int = 16,
    entropy_threshold: float | None = 0.4,
    pos_penalty_factor: float = 0.02,
    blockwise: bool = False,
) -> tuple[list[int], int]:
    """Greedy WeDLM continuation of `prompt` and the number of forwards it took."""
    committed = list(prompt)
    generated = 0
    window = [None] * min(window_size, max_new_tokens)  # None is a mask slot
    forwards = 0
    while True:
        leading = 0
        while leading < len(window) and window[leading] is not None:
            leading += 1
        if blockwise and leading < len(window):
            leading = 0
        window += [None] * min(leading, max_new_tokens - generated - len(window))
        for token in window[:leading]:
            committed.append(token)
            generated += 1
            if token in eos_token_ids or generated == max_new_tokens:
                return committed[len(prompt) :], forwards
        window = window[leading:]

        filled = [i for i, token in enumerate(window) if token is not None]
        masked = [i for i, token in enumerate(window) if token is None]
        order = filled + masked
        tokens = committed + [window[i] if window[i] is not None else mask_token_id for i in order]
        positions = list(range(len(committed))) + [len(committed) + i for i in order]
        logits = model(
            input_ids=torch.tensor([tokens]),
            position_ids=torch.tensor([positions]),
            attention_mask=torch.ones(1, len(tokens), dtype=torch.long),
        ).logits[0, len(committed) :].float()
        forwards += 1

        scores = {}
        for physical, slot in enumerate(order):
            if window[slot] is None:
                probs = torch.softmax(logits[physical], dim=-1).tolist()
                entropy = -sum(p * math.log(p) for p in probs if p > 0)
                scores[slot] = (entropy + pos_penalty_factor * (slot - masked[0]), physical)
        chosen = [slot for slot, (score, _) in scores.items() if entropy_threshold is not None and score < entropy_threshold]
        if not chosen:
            chosen = [min(scores, key=lambda slot: scores[slot][0])]
        for slot in chosen:
            row = logits[scores[slot][1]].clone()
            row[mask_token_id] = float("-inf")
            window[slot] = int(row.argmax())
