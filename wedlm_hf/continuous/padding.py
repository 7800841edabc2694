"""Prompts of different lengths as one batch, left-padded as batched `generate` takes them: a batch job and a
continuous-batching group build their inputs the same way."""

import torch


def left_padded(
    prompts: list[list[int]], pad_id: int, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, longest) input ids with `pad_id` before each shorter prompt, and the attention mask (1 on real tokens)."""
    longest = max(len(prompt) for prompt in prompts)
    input_ids = torch.full((len(prompts), longest), pad_id, dtype=torch.long, device=device)
    mask = torch.zeros_like(input_ids)
    for i, prompt in enumerate(prompts):
        input_ids[i, longest - len(prompt) :] = torch.tensor(prompt)
        mask[i, longest - len(prompt) :] = 1
    return input_ids, mask
