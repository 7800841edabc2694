"""lm-evaluation-harness with WeDLM decoding: its HF model, WeDLM-enabled, registered as `--model wedlm-hf`.

lm-eval's `HFLM` passes a task's `gen_kwargs` (and the command line's `--gen_kwargs`) straight to
`model.generate`, with its stop sequences as a `StoppingCriteria`, which WeDLM decoding honours. All it lacks is a
model whose `generate` knows `decoding="wedlm"`: `WeDLMHarnessModel` is `HFLM` with the loaded model passed
through `wedlm_hf.enable`, and with the model names of `wedlm_hf.loading` (named models, `folder:file.gguf`, PEFT
adapter folders without a tokenizer). Run lm-eval's own command line with it registered:

    python -m wedlm_hf.evaluation.harness run --model wedlm-hf --model_args pretrained=MODEL --device cpu \\
        --tasks TASK --gen_kwargs decoding=wedlm,wedlm_lossless=True

or, from Python, `lm_eval.simple_evaluate(model=WeDLMHarnessModel(pretrained=...), tasks=[...],
gen_kwargs="decoding=wedlm")`.
"""

import torch
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM
from transformers import PreTrainedModel

from ..draft_adapter.enabling import enable
from ..loading import load_model_and_tokenizer


@register_model("wedlm-hf")
class WeDLMHarnessModel(HFLM):
    """`HFLM` whose model decodes with WeDLM when the generation keywords ask for it (`decoding=wedlm`)."""

    def __init__(self, pretrained: "str | PreTrainedModel | None" = None, **kwargs) -> None:
        if not isinstance(pretrained, PreTrainedModel):  # any name `wedlm_hf.loading` takes (GGUF, adapter, named)
            device = kwargs.get("device") or ("cuda" if torch.cuda.is_available() else "cpu")
            pretrained, tokenizer = load_model_and_tokenizer(pretrained, dtype=kwargs.pop("dtype", "auto"))
            pretrained = pretrained.to(device)
            kwargs.setdefault("tokenizer", tokenizer)
        super().__init__(pretrained=pretrained, **kwargs)
        enable(self._model)


def main() -> None:
    """lm-eval's command line, with `--model wedlm-hf` registered."""
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()


if __name__ == "__main__":
    main()
