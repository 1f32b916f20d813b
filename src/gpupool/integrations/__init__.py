"""gpupool's job protocol inside the training frameworks people use, as their own callbacks.

    from gpupool.integrations.lightning import GpupoolCallback          # gpupool[lightning]
    from gpupool.integrations.huggingface import GpupoolTrainerCallback  # gpupool[huggingface]

Each saves through the framework's own checkpointing, into a folder gpupool commits (manifest
last, rename, LATEST), and finds the checkpoint to resume from for the user. The protocol they
share is `checkpointing.Checkpointing`; a loop of one's own uses `gpupool.job.Job` instead.
"""
