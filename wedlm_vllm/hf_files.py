"""`wedlm_hf` modules that import only the standard library, loaded by their paths: importing them through
`wedlm_hf` would run its `__init__`, which loads torch and transformers' models in every process vLLM starts."""

import importlib.util
from pathlib import Path
from types import ModuleType


def load(relative: str) -> ModuleType:
    """`wedlm_hf/<relative>` as a module of its own (`wedlm_vllm._<file name>`), without running `wedlm_hf`'s
    `__init__`."""
    package = importlib.util.find_spec("wedlm_hf")  # finds the package without importing it
    path = Path(package.origin).parent / relative
    spec = importlib.util.spec_from_file_location(f"wedlm_vllm._{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
