"""The check of what gpupool claims for GPUs, on a real one (issue 37): `check` runs its steps in
one call of a device machine, `wheels` prepares what that machine lacks."""
