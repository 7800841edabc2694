"""Tensor ops per decoding step outside the model forward: the decoder's own work, counted, not timed.

A `TorchDispatchMode` counts every aten op a `generate` call dispatches while the model's forward is not on the
stack (a forward pre-hook / hook pair on the top module marks it), divided by the call's model calls. The counts
are deterministic, so two versions of the decoder compare on a loaded machine where timings would not: run this
script against each (e.g. one from `git worktree add /tmp/old <commit>` first on PYTHONPATH). Greedy `generate()`
is printed as the yardstick: what transformers' own loop dispatches around each forward.

    python scripts/step_ops.py [--new-tokens 64] [--top 8]
"""

import argparse
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import wedlm_hf
from wedlm_hf.bench.models import load_model
from wedlm_hf.bench.prompts import code_prompts, counting_prompts


class OpCounter(TorchDispatchMode):
    """Counts aten ops by name, except while `in_forward` is set."""

    def __init__(self):
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.in_forward = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.in_forward:
            self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def count_ops(model, prompt: torch.Tensor, new_tokens: int, **options) -> tuple[float, Counter, int]:
    """(ops per step, ops by name, steps) of one greedy decode of `prompt` with EOS disabled."""
    counter = OpCounter()

    forwards = [0]

    def enter(*_) -> None:
        counter.in_forward = True
        forwards[0] += 1

    def leave(*_) -> None:
        counter.in_forward = False

    hooks = [model.register_forward_pre_hook(enter), model.register_forward_hook(leave)]
    try:
        with torch.inference_mode(), counter:
            model.generate(
                prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens, do_sample=False,
                eos_token_id=None, **options,
            )
    finally:
        for hook in hooks:
            hook.remove()
    steps = max(forwards[0], 1)
    return sum(counter.ops.values()) / steps, counter.ops, steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--top", type=int, default=8, help="ops listed by count per arm")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, tokenizer = load_model(wedlm_hf.DEFAULT_MODEL)
    code = tokenizer(code_prompts(1)[0], return_tensors="pt")["input_ids"]
    counting = tokenizer(counting_prompts(1)[0], return_tensors="pt")["input_ids"]
    arms = {
        "greedy generate() (code)": (code, {"decoding": "ar"}),
        "W=1 one slot per step (code)": (
            code, {"decoding": "wedlm", "wedlm_window_size": 1, "wedlm_entropy_threshold": None}
        ),
        "W=16 plain (code)": (code, {"decoding": "wedlm", "wedlm_window_size": 16}),
        "W=16 plain (counting)": (counting, {"decoding": "wedlm", "wedlm_window_size": 16}),
        "lossless (code)": (code, {"decoding": "wedlm", "wedlm_lossless": True}),
        "lossless (counting)": (counting, {"decoding": "wedlm", "wedlm_lossless": True}),
        "lossless + prompt lookup (code)": (
            code, {"decoding": "wedlm", "wedlm_lossless": True, "wedlm_prompt_lookup": True}
        ),
        "static W=16 (code)": (code, {"decoding": "wedlm", "wedlm_static": True}),
    }
    print(f"{args.new_tokens} new tokens, embedded checkpoint; {wedlm_hf.__file__}")
    print("| arm | steps | aten ops per step outside the forward |\n|---|---|---|")
    details = []
    for name, (prompt, options) in arms.items():
        per_step, ops, steps = count_ops(model, prompt, args.new_tokens, **options)
        print(f"| {name} | {steps} | {per_step:.1f} |")
        top = ", ".join(f"{op} {count / steps:.1f}" for op, count in ops.most_common(args.top))
        details.append(f"{name}: {top}")
    print("\nper step, most frequent ops:\n" + "\n".join(details))


if __name__ == "__main__":
    main()
