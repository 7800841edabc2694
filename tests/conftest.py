import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

# The suite's models are tiny: one intra-op thread is fastest, and it keeps the suite from collapsing when other
# processes share the cores (two torch threads on two busy cores wait on each other at every parallel region).
torch.set_num_threads(1)
