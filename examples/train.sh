#!/bin/sh
# A batch script, as for sbatch: the #GPUPOOL lines at the top are options of `gpupool submit`
# (options on the command line win). gpupool runs the copy it took when you submitted.
#GPUPOOL --name line-fit --team vision --priority low
#GPUPOOL --gpus 1 --time 0:10:00
#GPUPOOL -o line-fit-%j.log
set -e
echo "job $GPUPOOL_JOB_ID, attempt $GPUPOOL_ATTEMPT, on GPUs $CUDA_VISIBLE_DEVICES"
exec python -m gpupool.examples.trainer --steps 10 --step-seconds 0.1
