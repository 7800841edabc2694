"""Where a command's model runs: `--threads` (every command that runs a model) and `--device` checks.

torch's own default is one intra-op thread per core. On a shared machine that is the slow choice: every parallel
region waits for its slowest thread, and a thread whose core is busy elsewhere is descheduled. Measured on a
2-vCPU AMD EPYC with one core busy (2026-12-05): the embedded checkpoint decoded 20-32 tokens/s with 2 threads
against 244-983 with 1; a SmolLM2-135M-shaped model 1.5 tokens/s against 7.8. So the default leaves half the cores
to others, and caps the count at 4, where decoding one sequence has little left to split.
"""

import argparse
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

MAX_DEFAULT_THREADS = 4


def usable_cores() -> int:
    """The cores this process may run on (its affinity, as a container or `taskset` sets it), else all."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def default_threads(cores: int | None = None) -> int:
    """Half the cores, at least 1 and at most `MAX_DEFAULT_THREADS`."""
    cores = usable_cores() if cores is None else cores
    return max(1, min(MAX_DEFAULT_THREADS, cores // 2))


def _thread_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1; got {text!r}")
    return value


def add_threads_argument(parser: argparse.ArgumentParser) -> None:
    """`--threads N`; absent from the command line, `apply_threads` chooses (see there)."""
    parser.add_argument(
        "--threads", type=_thread_count, default=None, metavar="N",
        help="torch CPU threads (default: OMP_NUM_THREADS where set, else half the cores, at most "
        f"{MAX_DEFAULT_THREADS}: {default_threads()} here). More threads than free cores stall every step: on a "
        "2-vCPU machine with one core busy, 2 threads decoded 8-50x slower than 1",
    )


def apply_threads(args: argparse.Namespace) -> int:
    """Set torch's intra-op threads from `--threads`, else from an explicit OMP_NUM_THREADS (the user's word on
    this machine wins over the default rule), else `default_threads()`; store the count in `args.threads`."""
    import torch

    threads = args.threads
    if threads is None:
        threads = _omp_num_threads()
    if threads is None:
        threads = default_threads()
    torch.set_num_threads(threads)
    args.threads = threads
    return threads


def _omp_num_threads() -> int | None:
    text = os.environ.get("OMP_NUM_THREADS", "").strip()
    if not text:
        return None
    try:
        return _thread_count(text.split(",")[0])  # OpenMP's nested form "4,2": the outer level
    except argparse.ArgumentTypeError as error:
        raise ValueError(f"OMP_NUM_THREADS {error}: fix or unset it, or pass --threads N") from None


UNAVAILABLE = {
    "cuda": "this torch has no CUDA or sees no CUDA device",
    "mps": "Apple's MPS backend is not available on this machine",
}


def resolve_device(name: str, flag: str = "--device") -> "torch.device":
    """`name` as a torch device ('auto': cuda if available, else cpu), or an error naming `flag` and the way out
    where the device does not exist here."""
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as error:
        raise ValueError(f"{flag}: {error}") from error
    available = {"cuda": torch.cuda.is_available, "mps": torch.backends.mps.is_available}.get(device.type)
    if available is not None and not available():
        raise ValueError(f"{flag} {name}: {UNAVAILABLE[device.type]}; use {flag} cpu (or auto)")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(
            f"{flag} {name}: only {torch.cuda.device_count()} CUDA device(s) here; use {flag} cuda:0, cpu or auto"
        )
    return device
