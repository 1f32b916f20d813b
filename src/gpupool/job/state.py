"""What a checkpoint holds besides the user's objects: random number generators, and how files
are written (with PyTorch when the job uses it, with pickle otherwise).

RNG states are taken at a step boundary and restored last, just before the first step after a
resume, so that nothing draws from them in between: python's `random`, NumPy's global
generator, and PyTorch's CPU and CUDA generators (every device) when the job has imported it.
"""

from __future__ import annotations

import pickle
import random
import sys
from pathlib import Path
from typing import Any, Protocol


class Stateful(Protocol):
    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any, /) -> Any: ...


def _torch() -> Any | None:
    """PyTorch if the job imported it; gpupool.job never imports it for a job that does not."""
    return sys.modules.get("torch")


def capture_rng() -> dict[str, Any]:
    import numpy

    state: dict[str, Any] = {"python": random.getstate(), "numpy": numpy.random.get_state()}
    torch = _torch()
    if torch is not None:
        state["torch"] = torch.get_rng_state()
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    import numpy

    random.setstate(state["python"])
    numpy.random.set_state(state["numpy"])
    torch = _torch()
    if torch is not None and "torch" in state:
        torch.set_rng_state(state["torch"])
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])


def rank_file(rank: int) -> str:
    """The checkpoint's file of one rank's own state: its generators and its data position."""
    return f"rank-{rank}.pt"


def rank_state(data: Any) -> dict[str, Any]:
    """What that file holds, taken now: the generators, and `data` (a data position or None)."""
    return {"rng": capture_rng(), "data": data}


def write(path: Path, value: Any) -> None:
    torch = _torch()
    if torch is not None:
        torch.save(value, path)
    else:
        with path.open("wb") as stream:
            pickle.dump(value, stream, protocol=pickle.HIGHEST_PROTOCOL)


def read(path: Path, *, mmap: bool = True) -> Any:
    """A file `write` made. Checkpoints are the job's own files, written by the job itself.

    PyTorch's tensors are mapped from the file (copy-on-write), not read into memory first:
    `load_state_dict` then copies them once, into the model's own. A checkpoint pruned later is
    unlinked, and a mapping outlives that."""
    with path.open("rb") as stream:
        is_zip = stream.read(4) == b"PK\x03\x04"
    if is_zip:
        import torch

        return torch.load(path, weights_only=False, map_location="cpu", mmap=mmap)
    with path.open("rb") as stream:
        return pickle.load(stream)
