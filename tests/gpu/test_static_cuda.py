"""The static-shape path on a CUDA device: eager (`disable_compile=True`), the same tokens as the default decoder;
compiled as it is by default on CUDA (transformers' default `CompileConfig`: inductor with CUDA graphs), one graph
for several calls and the same tokens again.

fp32 with TF32 off, so the only differences left between the paths are summation orders (~1e-6 on the logits),
far below the gaps between these peaked tiny models' top logits."""

import pytest
import torch
from tiny_models import random_prompts, tiny_model
from transformers import CompileConfig

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(autouse=True)
def no_tf32():
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def decode(model, lengths, seed, **options):
    input_ids, attention_mask = random_prompts(lengths, seed=seed)
    return model.generate(
        input_ids=input_ids.cuda(), attention_mask=attention_mask.cuda(), decoding="wedlm", do_sample=False,
        max_new_tokens=40, **options,
    ).cpu()


@pytest.mark.parametrize("lossless", [False, True])
def test_static_matches_default_on_cuda(lossless):
    model = tiny_model("wedlm", peak=40).cuda()
    default = decode(model, [5, 17, 9], 2, wedlm_lossless=lossless)
    static = decode(model, [5, 17, 9], 2, wedlm_lossless=lossless, wedlm_static=True, disable_compile=True)
    assert torch.equal(static, default)


def test_compiled_static_step_with_cuda_graphs():
    torch._dynamo.reset()
    model = tiny_model("wedlm", peak=40).cuda()
    compiled = dict(cache_implementation="static", compile_config=CompileConfig(), max_cache_len=128)
    before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    for lengths, seed in (([5, 17, 9], 2), ([12, 3, 7], 3), ([5, 17, 9], 4)):
        eager = decode(model, lengths, seed, wedlm_static=True, disable_compile=True)
        assert torch.equal(decode(model, lengths, seed, **compiled), eager)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - before == 1
    torch._dynamo.reset()
