#!/bin/sh
# The real-size benchmark's job: one task per node runs node.py (slurm-dev/bench/realsize/).
set -eu
srun -N "$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 --label "$BENCH_NODE_PY" "$BENCH_HERE/node.py"
