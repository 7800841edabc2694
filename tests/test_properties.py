"""Property-based equivalence: drawn models, parameters, prompts, EOS and padding (hypothesis).

Each property runs 250 examples; on a mismatch hypothesis prints the falsifying example (all drawn values).
"""

from functools import lru_cache

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny_models import FAMILIES, MASK_ID, PAD_ID, random_prompts, tiny_model

import wedlm_hf
from wedlm_hf.generation.reference import reference_decode

EXAMPLES = 250


@lru_cache(maxsize=None)
def model_for(family: str, seed: int):
    return wedlm_hf.enable(tiny_model(family, seed=seed, peak=40))


requests = st.fixed_dictionaries(
    {
        "family": st.sampled_from(FAMILIES),
        "seed": st.integers(0, 2),
        "window_size": st.integers(1, 12),
        "threshold": st.one_of(st.none(), st.floats(0.0, 4.0)),
        "penalty": st.floats(0.0, 0.3),
        "lengths": st.lists(st.integers(1, 9), min_size=1, max_size=3),
        "max_new_tokens": st.integers(1, 14),
        "eos": st.integers(3, MASK_ID - 1),  # a drawn EOS id: rows stop at different, data-dependent places
        "prompt_seed": st.integers(0, 1000),
    }
)


def run(request, input_ids, attention_mask):
    model = model_for(request["family"], request["seed"])
    return model.generate(
        input_ids=input_ids,
        attention_mask=attention_mask,
        decoding="wedlm",
        mask_token_id=MASK_ID,
        eos_token_id=request["eos"],
        max_new_tokens=request["max_new_tokens"],
        wedlm_window_size=request["window_size"],
        wedlm_entropy_threshold=request["threshold"],
        wedlm_pos_penalty_factor=request["penalty"],
        return_dict_in_generate=True,
    )


def generated(output, row: int, width: int) -> list[int]:
    return output.sequences[row, width : width + output.wedlm_stats.generated[row]].tolist()


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests)
def test_cached_equals_cache_free_reference(request):
    input_ids, attention_mask = random_prompts(request["lengths"], seed=request["prompt_seed"])
    output = run(request, input_ids, attention_mask)
    model = model_for(request["family"], request["seed"])
    for row in range(len(request["lengths"])):
        prompt = input_ids[row][attention_mask[row].bool()].tolist()
        expected, forwards = reference_decode(
            model,
            prompt,
            request["max_new_tokens"],
            MASK_ID,
            [request["eos"]],
            request["window_size"],
            request["threshold"],
            request["penalty"],
        )
        assert generated(output, row, input_ids.shape[1]) == expected
        assert output.wedlm_stats.forwards[row] == forwards


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests)
def test_batched_equals_unbatched(request):
    input_ids, attention_mask = random_prompts(request["lengths"], seed=request["prompt_seed"])
    batched = run(request, input_ids, attention_mask)
    width = input_ids.shape[1]
    for row, length in enumerate(request["lengths"]):
        alone = run(request, input_ids[row : row + 1, width - length :], attention_mask[row : row + 1, width - length :])
        assert generated(batched, row, width) == generated(alone, 0, length)
        padding = batched.sequences[row, width + batched.wedlm_stats.generated[row] :]
        assert bool((padding == PAD_ID).all()), "finished rows are padded with pad_token_id"
