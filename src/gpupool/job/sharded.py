"""Sharded state (FSDP2 `fully_shard`, tensor parallelism: parameters that are DTensors) saved
with `torch.distributed.checkpoint` (DCP): every rank writes its own shards.

A checkpoint of a sharded job holds, besides its other files, `sharded/`: DCP's files, one per
rank, and its `.metadata`, which DCP's coordinator writes once every rank has written. gpupool's
commit comes after that (its manifest lists them all, `.metadata` among them), so a checkpoint
is whole only when DCP's is. DCP reshards on load: a job resumed at another world size gets the
very same parameters and optimizer state, laid out anew (its data order and random numbers are
not those an uninterrupted run would have had: see `gpupool.job.data.Batches`).

Each registered module (whose parameters are DTensors) goes to DCP with the registered
optimizers that train it, through `torch.distributed.checkpoint.state_dict` (keys by parameter
name, the optimizer's state made before its first step): what else is registered (an LR
scheduler, a step counter) is small and alike on every rank, and rank 0 saves it as before.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpupool.job.checkpoints import CheckpointError

FOLDER = "sharded"


def is_sharded(module: Any) -> bool:
    """Whether `module` is a torch module with a DTensor among its parameters (PyTorch 2.5 and
    later have DTensor in public: sharded checkpoints need it)."""
    from torch import nn

    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # an older PyTorch, or one built without torch.distributed
        return False

    return isinstance(module, nn.Module) and any(isinstance(p, DTensor) for p in module.parameters())


class Trained:
    """A sharded module and the optimizers of its parameters, as one DCP `Stateful`."""

    def __init__(self, module: Any, optimizers: list[Any]) -> None:
        self.module, self.optimizers = module, optimizers

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model, optimizers = get_state_dict(self.module, self.optimizers)
        return {"model": model, "optimizers": optimizers}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_state_dict

        set_state_dict(
            self.module, self.optimizers, model_state_dict=state["model"], optim_state_dict=state["optimizers"]
        )


def split(objects: dict[str, Any]) -> tuple[dict[str, Trained], dict[str, Any]]:
    """(the sharded modules with their optimizers, by the module's name; the other objects)."""
    import torch

    sharded = {name: obj for name, obj in objects.items() if is_sharded(obj)}
    if not sharded:
        return {}, dict(objects)
    owners = {id(p): name for name, module in sharded.items() for p in module.parameters()}
    trains: dict[str, list[Any]] = {name: [] for name in sharded}
    rest: dict[str, Any] = {}
    for name, obj in objects.items():
        if name in sharded:
            continue
        if isinstance(obj, torch.optim.Optimizer):
            found = {owners.get(id(p)) for group in obj.param_groups for p in group["params"]}
            if None not in found and len(found) == 1:
                trains[found.pop() or ""].append(obj)
                continue
            if found - {None}:
                raise ValueError(f"optimizer {name!r} trains sharded and other parameters: give it one module")
        rest[name] = obj
    return {name: Trained(sharded[name], trains[name]) for name in sharded}, rest


def write(folder: Path, state: dict[str, Any], group: Any) -> None:
    """Every rank writes its shards of `state` into `folder/sharded` (fsynced); then DCP's
    coordinator writes the metadata. A collective on `group`."""
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.filesystem import FileSystemWriter
    from torch.distributed.checkpoint.state_dict_saver import save

    writer = FileSystemWriter(folder / FOLDER, sync_files=True, overwrite=False)
    try:
        save(state, storage_writer=writer, process_group=group)
    except CheckpointException as exc:  # a BaseException: it would pass every `except Exception`
        raise CheckpointError(f"the sharded save failed: {exc}") from exc


def read(folder: Path, trained: dict[str, Trained], group: Any) -> None:
    """Load the shards into the modules and optimizers, resharded to this run's layout."""
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.state_dict_loader import load

    try:
        load(dict(trained), storage_reader=FileSystemReader(folder / FOLDER), process_group=group)
    except CheckpointException as exc:  # on every rank alike: DCP gathers the ranks' failures
        raise CheckpointError(f"its shards do not load: {exc}") from exc
