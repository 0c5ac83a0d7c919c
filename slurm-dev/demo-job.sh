#!/bin/sh
# The demo's training job: what a real one does at startup, in miniature.
echo "image: ${BOOTSEER_IMAGE:-none}"
srun -N "$SLURM_JOB_NUM_NODES" sh -c 'echo "$(hostname -s)/$SLURMD_NODENAME sees BOOTSEER_IMAGE=${BOOTSEER_IMAGE:-}"'

# The checkpoint: the first run saves one through the striped mount ($BOOTSEER_CKPT),
# later runs load it on every node and mark the load as their ckpt_load phase.
if [ -n "${BOOTSEER_CKPT:-}" ]; then
  if [ -f "$BOOTSEER_CKPT/demo/model.bin" ]; then
    srun -N "$SLURM_JOB_NUM_NODES" sh -c '
      bootseer phase start ckpt_load >/dev/null 2>&1 || true
      n=$(cat "$BOOTSEER_CKPT/demo/model.bin" | wc -c)
      bootseer phase end ckpt_load --bytes "$n" >/dev/null 2>&1 || true
      echo "$(hostname -s) loaded $n bytes from $BOOTSEER_CKPT/demo/model.bin"' | sort
  else
    mkdir -p "$BOOTSEER_CKPT/demo"
    head -c 67108864 /dev/urandom > "$BOOTSEER_CKPT/demo/model.bin"
    echo "saved $(wc -c < "$BOOTSEER_CKPT/demo/model.bin") bytes to $BOOTSEER_CKPT/demo/model.bin"
  fi
fi
