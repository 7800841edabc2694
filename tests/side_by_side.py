"""Several `generate` calls on one model from threads of their own, started together (the demo's WeDLM and AR
sides), for tests that each equals its lone result."""

import threading
from collections.abc import Callable

import torch
from patience import PATIENCE_S


def run_side_by_side(runs: dict, generate: Callable[[dict], torch.Tensor], rounds: int) -> dict[str, list]:
    """`rounds` calls of `generate(runs[name])` per name, each name on a thread of its own; the outputs by name.
    A call's exception is raised here, on the test's thread."""
    outputs, errors, start = {name: [] for name in runs}, [], threading.Barrier(len(runs))

    def side(name: str) -> None:
        try:
            start.wait()
            for _ in range(rounds):
                outputs[name].append(generate(runs[name]))
        except Exception as error:  # reported below, on the test's thread
            errors.append(error)

    threads = [threading.Thread(target=side, args=(name,)) for name in runs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=PATIENCE_S)
    assert not errors, errors
    return outputs
