#!/bin/sh
# The startup benchmark's job: one task per node runs node.sh (slurm-dev/bench/startup/).
set -eu
srun -N "$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 --label "$BENCH_HERE/node.sh"
