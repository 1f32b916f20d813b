"""Staging: a copy of a job's state in CPU memory, taken at a step boundary, that a background
save writes while training goes on and changes the original.

Tensors are copied into buffers kept from one save to the next (pinned memory for tensors on a
GPU, so that the copy is a DMA transfer): allocating and faulting in hundreds of megabytes each
time costs ten times the copy. A background save never overlaps the next staging (at most one
save is in flight), so a buffer is never written while it is being read. Everything else in the
state (numbers, lists, the optimizer's hyper-parameters, NumPy arrays) is deep-copied.
"""

from __future__ import annotations

import copy
import sys
from typing import Any

KeyPath = tuple[Any, ...]
"""Where a tensor sits in the state: the keys and indices leading to it."""


class Stager:
    def __init__(self) -> None:
        self._buffers: dict[KeyPath, Any] = {}
        self._used: dict[KeyPath, Any] = {}
        self._devices: set[Any] = set()

    @property
    def held_bytes(self) -> int:
        """CPU memory the buffers hold between saves."""
        return sum(b.numel() * b.element_size() for b in self._buffers.values())

    def stage(self, value: Any) -> Any:
        """A copy of `value` that shares nothing with it."""
        self._used, self._devices = {}, set()
        staged = self._copy(value, ())
        for device in self._devices:  # the non-blocking copies have landed, from every GPU
            sys.modules["torch"].cuda.synchronize(device)
        self._buffers = self._used  # buffers of keys gone from the state are let go
        return staged

    def _copy(self, value: Any, path: KeyPath) -> Any:
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(value, torch.Tensor):
            return self._tensor(torch, value, path)
        if isinstance(value, dict):
            # A shallow copy keeps the mapping's type and attributes (a module's state_dict is
            # an OrderedDict whose `_metadata` load_state_dict reads).
            out = copy.copy(value)
            for key, item in value.items():
                out[key] = self._copy(item, (*path, key))
            return out
        if isinstance(value, list):
            return [self._copy(item, (*path, i)) for i, item in enumerate(value)]
        if isinstance(value, tuple):
            items = [self._copy(item, (*path, i)) for i, item in enumerate(value)]
            return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
        return copy.deepcopy(value)

    def _tensor(self, torch: Any, tensor: Any, path: KeyPath) -> Any:
        source = tensor.detach()
        if type(source) is not torch.Tensor or source.layout != torch.strided or source.is_quantized:
            return source.to("cpu", copy=True)  # sparse, quantized, subclasses: no buffer reuse
        buffer = self._buffers.get(path)
        if buffer is None or buffer.shape != source.shape or buffer.dtype != source.dtype:
            pinned = source.is_cuda and torch.cuda.is_available()
            buffer = torch.empty(source.shape, dtype=source.dtype, device="cpu", pin_memory=pinned)
        buffer.copy_(source, non_blocking=source.is_cuda)
        if source.is_cuda:
            self._devices.add(source.device)
        self._used[path] = buffer
        return buffer
