#!/bin/sh
# The demo's training job. Every node starts as a real one does: the container, its
# dependencies, the checkpoint, the first training step; each becomes a phase in the
# report. $BOOTSEER_DEMO is slurm-dev/ (exported by slurm-dev/demo).
set -eu
srun -N "$SLURM_JOB_NUM_NODES" --label "$BOOTSEER_DEMO/demo-app/node-start.sh" | sort -s -k1,1n

# The first run saves a checkpoint through the striped mount; later runs load it.
if [ -n "${BOOTSEER_CKPT:-}" ] && [ ! -f "$BOOTSEER_CKPT/demo/model.bin" ]; then
  mkdir -p "$BOOTSEER_CKPT/demo"
  head -c 67108864 /dev/urandom > "$BOOTSEER_CKPT/demo/model.bin"
  echo "saved $(wc -c < "$BOOTSEER_CKPT/demo/model.bin") bytes to $BOOTSEER_CKPT/demo/model.bin"
fi
