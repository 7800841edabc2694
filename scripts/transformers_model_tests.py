"""transformers' own common model tests (`ModelTesterMixin`, `ConfigTester`) on the WeDLM classes, both layouts.

    python scripts/transformers_model_tests.py [pytest arguments]

transformers' wheel ships no tests. Its sdist for the installed version (fetched with `pip download` into
`$TMPDIR/transformers-<version>-tests/`, once) ships the top-level tests (`test_modeling_common.py`,
`test_configuration_common.py`, ...) but not `tests/models/`, `causal_lm_tester.py`, `generation/test_utils.py`,
`exporters/` or `utils/`. So the released top-level files run as they are, beside three stand-ins for the modules
they import that the sdist lacks (so the generation and export mixins' tests do not run), and the testers below
take the place of the Qwen2/Qwen3 testers: `WeDLMConfig(attention_bias=True)` builds Qwen2's layers,
`attention_bias=False` Qwen3's. Not part of the project's test suite (docs/architecture.md says what passes).
"""

import subprocess
import sys
import tarfile
import tempfile
import unittest
from pathlib import Path

import transformers
from transformers.models.auto import modeling_auto

from wedlm_hf import WeDLMConfig, WeDLMForCausalLM, WeDLMModel

PACKAGE = "transformers_tests"
STAND_INS = {
    "exporters/test_export.py": "class ExportTesterMixin:\n    pass\n",
    "generation/test_utils.py": "class GenerationTesterMixin:\n    pass\n",
    # arguments every config takes, with values other than their defaults (ConfigTester checks they are kept)
    "utils/test_configuration_utils.py": (
        'config_common_kwargs = {"return_dict": False, "output_hidden_states": True, "dtype": "float16", '
        '"tie_word_embeddings": True, "pad_token_id": 5, "bos_token_id": 6, "eos_token_id": 7}\n'
    ),
}


def released_tests() -> Path:
    """The folder holding package `PACKAGE`: the sdist's top-level tests and the stand-ins, made once."""
    root = Path(tempfile.gettempdir()) / f"transformers-{transformers.__version__}-tests"
    package = root / PACKAGE
    if not (package / "test_modeling_common.py").exists():
        download = root / "sdist"
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--dest", str(download),
             f"transformers=={transformers.__version__}"],
            check=True,
        )
        with tarfile.open(next(download.glob("transformers-*.tar.gz"))) as sdist:
            top_level = [m for m in sdist.getmembers() if m.isfile() and Path(m.name).parts[1:-1] == ("tests",)]
            for member in top_level:
                member.name = Path(member.name).name
            sdist.extractall(package, members=top_level, filter="data")
        for relative, text in {"__init__.py": "", **STAND_INS}.items():
            (package / relative).parent.mkdir(parents=True, exist_ok=True)
            (package / Path(relative).parent / "__init__.py").touch()
            (package / relative).write_text(text)
    return root


sys.path.insert(0, str(released_tests()))
from transformers_tests.test_configuration_common import ConfigTester
from transformers_tests.test_modeling_common import (
    GenerationTesterMixin,
    ModelTesterMixin,
    ids_tensor,
    random_attention_mask,
)

# the Auto-class names transformers' tests look models up by, as an in-tree model would be listed
modeling_auto.MODEL_MAPPING_NAMES["wedlm"] = WeDLMModel.__name__
modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES["wedlm"] = WeDLMForCausalLM.__name__


class WeDLMModelTester:
    """Tiny WeDLM configs and inputs, at the sizes of transformers' causal LM testers but with grouped-query heads
    (the window attention's case)."""

    batch_size, seq_length, is_training = 13, 7, True
    vocab_size, hidden_size, intermediate_size = 99, 32, 37
    num_hidden_layers, num_attention_heads, num_key_value_heads = 2, 4, 2

    def __init__(self, parent: unittest.TestCase, attention_bias: bool):
        self.parent = parent
        self.attention_bias = attention_bias

    def get_config(self) -> WeDLMConfig:
        return WeDLMConfig(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            attention_bias=self.attention_bias,
            max_position_embeddings=512,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            mask_token_id=self.vocab_size - 1,
        )

    def prepare_config_and_inputs_for_common(self) -> tuple[WeDLMConfig, dict]:
        input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size - 1)
        attention_mask = random_attention_mask([self.batch_size, self.seq_length])
        return self.get_config(), {"input_ids": input_ids, "attention_mask": attention_mask}


class WeDLMModelTest(ModelTesterMixin, GenerationTesterMixin):
    all_model_classes = (WeDLMModel, WeDLMForCausalLM)
    test_can_init_all_missing_weights_before_2023 = True  # it dates models by a copyright line, which ours lack
    attention_bias: bool

    def setUp(self):
        self.model_tester = WeDLMModelTester(self, self.attention_bias)
        self.config_tester = ConfigTester(self, config_class=WeDLMConfig, hidden_size=32, attention_bias=self.attention_bias)

    def test_config(self):
        self.config_tester.run_common_tests()

    def test_generation_tester_mixin_inheritance(self):
        self.skipTest("GenerationTesterMixin is a stand-in here: tests/generation/ is not in the sdist")


class WeDLMQwen2LayoutTest(WeDLMModelTest, unittest.TestCase):
    attention_bias = True


class WeDLMQwen3LayoutTest(WeDLMModelTest, unittest.TestCase):
    attention_bias = False


if __name__ == "__main__":
    import pytest

    sys.exit(pytest.main([__file__, "-p", "no:cacheprovider", *sys.argv[1:]]))
