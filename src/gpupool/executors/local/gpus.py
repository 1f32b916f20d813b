"""The GPUs of this machine: from NVML when there are any, else virtual ones, labelled so."""

from __future__ import annotations

from dataclasses import dataclass

from gpupool.model import Node


@dataclass(frozen=True, slots=True)
class LocalGpus:
    node: Node
    virtual: bool
    detail: str


def discover(hostname: str, virtual_gpus: int) -> LocalGpus:
    """The machine as one node: its NVIDIA GPUs if NVML finds any, else `virtual_gpus` virtual
    GPUs of type `virtual` (for trying gpupool on a laptop, or for tests)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            count = int(pynvml.nvmlDeviceGetCount())
            names = {str(pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))) for i in range(count)}
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:  # NVML raises its own error types, or the library is simply absent
        reason = f"no NVIDIA GPU found ({type(exc).__name__})"
    else:
        if count > 0:
            gpu_type = names.pop() if len(names) == 1 else "mixed"
            return LocalGpus(Node(hostname, count, gpu_type), False, f"{count} × {gpu_type} (NVML)")
        reason = "NVML reports no GPU"
    if virtual_gpus < 1:
        raise ValueError(f"{reason}, and virtual_gpus is {virtual_gpus}: nothing to schedule on")
    return LocalGpus(Node(hostname, virtual_gpus, "virtual"), True, f"{virtual_gpus} virtual GPUs: {reason}")
