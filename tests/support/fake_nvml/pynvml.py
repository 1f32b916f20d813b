"""A stand-in for NVIDIA's `pynvml` (nvidia-ml-py), for the tests of what gpupool does with real
GPUs: the GPUs and their compute processes are read, at every call, from the JSON file that
$GPUPOOL_FAKE_NVML names, which the test writes:

    {"gpus": [{"name": "NVIDIA H100 80GB HBM3", "memory": 85520809984, "utilization": 97,
               "processes": [{"pid": 4242, "memory": 3221225472}]}]}

Put its folder first on PYTHONPATH of the process under test. Only the calls gpupool makes."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace
from typing import Any


class NVMLError(Exception):
    pass


def _gpus() -> list[dict[str, Any]]:
    try:
        with open(os.environ["GPUPOOL_FAKE_NVML"]) as stream:
            return list(json.load(stream)["gpus"])
    except (KeyError, OSError, ValueError) as exc:
        raise NVMLError(f"fake NVML: {exc}") from None


def nvmlInit() -> None:
    _gpus()


def nvmlShutdown() -> None:
    return None


def nvmlDeviceGetCount() -> int:
    return len(_gpus())


def nvmlDeviceGetHandleByIndex(index: int) -> int:
    if not 0 <= index < len(_gpus()):
        raise NVMLError(f"no GPU {index}")
    return index


def nvmlDeviceGetName(handle: int) -> str:
    return str(_gpus()[handle]["name"])


def nvmlDeviceGetMemoryInfo(handle: int) -> SimpleNamespace:
    gpu = _gpus()[handle]
    used = sum(int(p.get("memory") or 0) for p in gpu.get("processes", []))
    return SimpleNamespace(total=int(gpu["memory"]), used=used, free=int(gpu["memory"]) - used)


def nvmlDeviceGetComputeRunningProcesses(handle: int) -> list[SimpleNamespace]:
    return [
        SimpleNamespace(pid=int(p["pid"]), usedGpuMemory=p.get("memory")) for p in _gpus()[handle].get("processes", [])
    ]


def nvmlDeviceGetUtilizationRates(handle: int) -> SimpleNamespace:
    gpu = _gpus()[handle]
    return SimpleNamespace(gpu=int(gpu.get("utilization", 0)), memory=0)
