import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

# The suite's models are tiny: one intra-op thread is fastest, and it keeps the suite from collapsing when other
# processes share the cores (two torch threads on two busy cores wait on each other at every parallel region).
torch.set_num_threads(1)


@pytest.fixture(autouse=True, scope="session")
def no_stored_forward_costs(tmp_path_factory):
    """Forward cost profiles stored on this machine (`wedlm-hf bench --store-forward-cost`) would change lossless
    mode's draft widths, which tests count: the suite (and the commands it starts) reads and stores none but its
    own, in a folder of its own."""
    os.environ["WEDLM_HF_FORWARD_COST"] = str(tmp_path_factory.mktemp("forward_cost") / "forward_cost.json")
    yield
    os.environ.pop("WEDLM_HF_FORWARD_COST")
