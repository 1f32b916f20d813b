"""What an attempt starts with (`Launch`): its job's folders made and given to its user, its
command (a batch script runs from the copy in its job's folder), its environment (the job's
own variables, the job protocol's `GPUPOOL_*`, where compilers keep what they made) and its
logs, their paths checked again."""

from __future__ import annotations

from pathlib import Path

from gpupool.executors import Launch, Resources, members_of
from gpupool.executors.users import JobUser
from gpupool.model import Placement, SessionKind
from gpupool.service.workspace import Workspace
from gpupool.store.schema import JobRow


def prepare_launch(
    workspace: Workspace,
    job: JobRow,
    placement: Placement,
    user: JobUser | None,
    protocol: dict[str, str],
) -> Launch:
    """The launch of the job's newest attempt on `placement`, as `user`; `protocol` is how it
    reaches the service (`GPUPOOL_API`, `GPUPOOL_TOKEN`, ...: `protocol_env`)."""
    attempt = job.attempts - 1
    attempt_dir = workspace.attempt_dir(job.id, attempt)
    checkpoints, cache = workspace.job_folders(job.id, user)
    command = list(job.command)
    if job.script is not None:
        command[0] = str(workspace.script_file(job, user))
    env = {
        **compile_caches(cache),  # the job's own settings win
        **{k: str(v) for k, v in job.env.items()},
        **({"USER": user.name, "LOGNAME": user.name, "HOME": user.home} if user is not None else {}),
        "GPUPOOL_JOB_ID": str(job.id),
        "GPUPOOL_ATTEMPT": str(attempt),
        "GPUPOOL_CHECKPOINT_DIR": str(checkpoints),
        "GPUPOOL_CACHE_DIR": str(cache),
        "GPUPOOL_NOTICE_FILE": str(attempt_dir / "notice"),
        **protocol,
    }
    if job.array_id is not None:
        env["GPUPOOL_ARRAY_ID"] = str(job.array_id)
        env["GPUPOOL_ARRAY_INDEX"] = str(job.array_index)
    stdout, stderr = workspace.checked_log_files(job, attempt)
    members = members_of(placement)
    resources = Resources(job.mem, job.mem_per_gpu, job.cpus_per_gpu)
    if job.session is not None:
        env["GPUPOOL_SESSION"] = job.session
    tty = job.session == SessionKind.SHELL.value
    return Launch(
        job.id, attempt, command, Path(job.workdir), env, attempt_dir, members, stdout, stderr, user, resources, tty
    )


def protocol_env(api_url: str, token: str, interruption_interval: float | None) -> dict[str, str]:
    """The job protocol's variables that are not about the job's folders: where the API is, the
    attempt's token, and the mean time between interruptions its class met lately (for its
    checkpoint interval), when there is one."""
    env = {"GPUPOOL_API": api_url, "GPUPOOL_TOKEN": token}
    if interruption_interval is not None:
        env["GPUPOOL_INTERRUPTION_INTERVAL"] = f"{interruption_interval:.0f}"
    return env


def compile_caches(cache: Path) -> dict[str, str]:
    """Where compilers keep what they made, in the job's folder that outlives its attempts: a
    resumed attempt (on any node, where the folder is shared) finds the kernels and graphs the
    earlier ones compiled, instead of compiling them again (PyTorch Inductor's FX graph and
    AOTAutograd caches, Triton's kernels, CUDA's JIT cache)."""
    return {
        "TORCHINDUCTOR_CACHE_DIR": str(cache / "torchinductor"),
        "TRITON_CACHE_DIR": str(cache / "triton"),
        "CUDA_CACHE_PATH": str(cache / "cuda"),
    }
