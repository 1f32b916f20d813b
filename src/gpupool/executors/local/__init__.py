"""Attempts as local processes on this machine, one node of the pool: the executor
(`executor.py`) and the machine's GPUs (`gpus.py`)."""

from gpupool.executors.local.executor import LocalExecutor

__all__ = ["LocalExecutor"]
