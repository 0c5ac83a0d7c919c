#!/bin/sh
# The demo's training job: what a real one does at startup, in miniature.
echo "image: ${BOOTSEER_IMAGE:-none}"
srun -N "$SLURM_JOB_NUM_NODES" sh -c 'echo "$(hostname -s)/$SLURMD_NODENAME sees BOOTSEER_IMAGE=${BOOTSEER_IMAGE:-}"'
