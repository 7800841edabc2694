"""Model cards of exported folders: Hub metadata (license, library, pipeline, tags, base model) and the sections a
reader needs before loading remote code (usage, requirements, limitations)."""

from huggingface_hub import ModelCard, ModelCardData

from wedlm_hf.generation.options import OPTIONS

PAPER_TAG = "arxiv:2512.22737"
PAPER_URL = "https://arxiv.org/abs/2512.22737"
SUPPORTED = "Llama, Mistral, Qwen2/3, Gemma, Phi-3, OLMo-2, Granite and other"


def _front_matter(license: str, tags: list[str], base_model: str | None) -> str:
    data = ModelCardData(
        license=license,
        library_name="transformers",
        pipeline_tag="text-generation",
        tags=tags,
        base_model=base_model,
    )
    return f"---\n{data.to_yaml()}\n---\n"


def _requirements(transformers_requirement: str) -> str:
    return (
        "## Requirements\n\n"
        f"`transformers{transformers_requirement}` and torch; nothing else (the decoding code ships in this "
        "repository). On another transformers version the code stops at import with a message naming the "
        f"range: `pip install 'transformers{transformers_requirement}'`.\n"
    )


def model_folder_card(
    repo_id: str, *, has_weights: bool, license: str, base_model: str | None, transformers_requirement: str
) -> ModelCard:
    """Card of a remote-code WeDLM model folder; `repo_id` is what its snippet loads."""
    weights = "" if has_weights else (
        "\nThis repository holds the configuration and code only; add the weights and tokenizer next to them.\n"
    )
    base = f"\nWeights: `{base_model}`.\n" if base_model else ""
    return ModelCard(
        _front_matter(license, ["wedlm", "custom_code", PAPER_TAG], base_model)
        + f"\n# {repo_id}\n\n"
        f"A causal LM decoded with WeDLM streaming parallel decoding ([arXiv 2512.22737]({PAPER_URL})): several "
        "tokens committed per forward, with standard causal attention and a prefix KV cache.\n"
        f"{base}{weights}\n"
        "## Usage\n\n```python\n"
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
        f'model = AutoModelForCausalLM.from_pretrained("{repo_id}", trust_remote_code=True)\n'
        f'tokenizer = AutoTokenizer.from_pretrained("{repo_id}", trust_remote_code=True)\n'
        'inputs = tokenizer("def fibonacci(n):", return_tensors="pt")\n'
        'output = model.generate(**inputs, decoding="wedlm", max_new_tokens=64, return_dict_in_generate=True)\n'
        "print(tokenizer.decode(output.sequences[0]), output.wedlm_stats.summary())\n```\n\n"
        '`decoding="ar"` gives ordinary autoregressive decoding; `wedlm_lossless=True` gives output identical to '
        "greedy autoregressive decoding. `wedlm_window_size`, `wedlm_entropy_threshold` and "
        "`wedlm_pos_penalty_factor` default to this repository's `generation_config.json`.\n\n"
        + _requirements(transformers_requirement)
        + "\n## Limitations\n\n"
        "- The speed-up needs a model trained for WeDLM decoding; on any other model only lossless mode gives "
        "sensible text, at about the speed of autoregressive decoding.\n"
        "- Not supported with WeDLM decoding: beam search, assisted decoding, sliding-window attention.\n"
        "- The model's quality, languages and biases are those of its training data; this card describes the "
        "decoding code, exported by `wedlm-hf export`.\n"
    )


def custom_generate_card(
    repo_id: str, *, has_model: bool, license: str, base_model: str | None, transformers_requirement: str
) -> ModelCard:
    """Card of a `custom_generate` repository, with the sections transformers' documentation asks such a card for."""
    if has_model:
        base = f"`{base_model}`, included in this repository." if base_model else "the model in this repository."
    else:
        base = f"`{base_model}`." if base_model else "none: bring any compatible model."
    model_id = repo_id if has_model else "your/model"
    recipe = "" if has_model else f'custom_generate="{repo_id}", trust_remote_code=True, '
    usage = (
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
        f'tokenizer = AutoTokenizer.from_pretrained("{model_id}")\n'
        f'model = AutoModelForCausalLM.from_pretrained("{model_id}"{", trust_remote_code=True" if has_model else ""})\n'
        'inputs = tokenizer("def fibonacci(n):", return_tensors="pt")\n'
        "output = model.generate(\n"
        f"    **inputs, {recipe}mask_token_id=tokenizer.mask_token_id,\n"
        "    max_new_tokens=64, return_dict_in_generate=True,\n)\n"
        "print(tokenizer.decode(output.sequences[0]), output.wedlm_stats.summary())\n"
    )
    loading = (
        "Loaded with `trust_remote_code=True`, the model's `generate` is this recipe.\n\n" if has_model else ""
    )
    return ModelCard(
        _front_matter(license, ["custom_generate", "wedlm", PAPER_TAG], base_model)
        + "\n# WeDLM parallel decoding (`custom_generate`)\n\n"
        "## Description\n\n"
        f"WeDLM streaming parallel decoding ([arXiv 2512.22737]({PAPER_URL})) as a `generate` recipe: a sliding "
        "window of mask slots after the prompt, several tokens committed per forward, standard causal attention "
        "and the model's own KV cache. transformers prepares inputs, logits processors and stopping criteria as "
        "usual; only the decoding loop is replaced.\n\n"
        f"## Base model\n\n{base}\n\n"
        "## Model compatibility\n\n"
        f"Decoder-only {SUPPORTED} models (rotary position ids, no sliding-window attention). The speed-up needs a "
        "model trained for WeDLM decoding (it must predict the token at a mask slot's position); on other models "
        "use `wedlm_lossless=True`, which gives greedy decoding's output. Batched, left-padded inputs work.\n\n"
        "## Additional arguments\n\n"
        + "".join(
            f"- `{option.keyword}` ({option.accepts.describe()}; default `{option.default!r}`): {option.help}.\n"
            for option in OPTIONS
        )
        + "\n"
        "Each is read from the call, else from the model's generation config (attributes of the same names).\n\n"
        "## Output type changes\n\n"
        "With `return_dict_in_generate=True` the output is a `GenerateDecoderOnlyOutput` with one more field, "
        "`wedlm_stats`: per-row `forwards`, `generated`, `processed`, `fill_steps`, `commit_steps`, the batch's "
        "`model_calls`, and `summary()` (tokens per forward, prefix cacheability). Without it, a tensor of "
        "sequences as usual.\n\n"
        f"## Example usage\n\n{loading}```python\n{usage}```\n\n"
        + _requirements(transformers_requirement)
        + "\n## Limitations\n\n"
        "- Not supported with this recipe: beam search, assisted decoding, `synced_gpus`, sliding-window "
        "attention; each is refused with a message.\n"
        "- Written by `wedlm-hf export --custom-generate`; it imports only torch and transformers.\n"
    )
