#!/bin/sh
# One node's start in the startup benchmark (one task per node), as a training job's:
# the container from its image, the dependency install, the checkpoint load, the first
# step. Each is a phase mark, so `bootseer report` has every node's ready time.
#
# BENCH_VARIANT=baseline: pull the whole image from the store to local disk, install,
#   read the checkpoint as one object from the store (no bootseer technique).
# BENCH_VARIANT=bootseer: the image is $BOOTSEER_IMAGE (lazy, prefetched), the install
#   goes through `bootseer deps run` (restored by the prolog when a snapshot fits), the
#   checkpoint is read through the striped mount $BOOTSEER_CKPT. With BENCH_SAVE=1 the
#   first task saves the checkpoint through the mount after its first step.
set -eu
mark() { bootseer phase "$@" >/dev/null; }
local=/var/tmp/slurm-dev-local/startup-bench
prefix=$local/env
mkdir -p "$local"

# The container: squashfuse mounts the image and its entry point reads what it needs.
if [ "$BENCH_VARIANT" = baseline ]; then
  image=$local/image.sqsh
  mark start image_pull
  rm -f "$image"
  curl -sSf -o "$image" "$BENCH_STORE_URL/$BENCH_IMAGE_KEY"
  mark end image_pull --bytes "$(stat -c %s "$image")"
else
  image=$BOOTSEER_IMAGE
fi
mark start container_start
mnt=$(mktemp -d)
squashfuse "$image" "$mnt"
trap 'fusermount3 -u "$mnt"; rmdir "$mnt"' EXIT
python3 "$mnt/app/start.py"
mark end container_start

# The dependencies: a venv of real wheels from the index on the store host.
install="$BENCH_UV venv -q --python $BENCH_PY $prefix && UV_CACHE_DIR=\$(mktemp -d) $BENCH_UV pip install -q --no-cache --python $prefix/bin/python --index-url $BENCH_INDEX -r $BENCH_REQ"
if [ "$BENCH_VARIANT" = baseline ]; then
  rm -rf "$prefix"
  bootseer phase run deps_install -- sh -c "$install"
else
  bootseer deps run -- sh -c "$install" >&2
  test -x "$prefix/bin/python"
fi

# The checkpoint: every node reads all of it (a data-parallel restart).
if [ "$BENCH_VARIANT" = baseline ]; then
  mark start ckpt_load
  n=$(curl -sSf "$BENCH_STORE_URL/$BENCH_CKPT_KEY" | wc -c)
  mark end ckpt_load --bytes "$n"
elif [ -f "$BOOTSEER_CKPT/model.bin" ]; then
  mark start ckpt_load
  n=$(cat "$BOOTSEER_CKPT/model.bin" | wc -c)
  mark end ckpt_load --bytes "$n"
fi

# The first step: little compute, from the installed packages.
mark start first_step
"$prefix/bin/python" -c "import $BENCH_IMPORTS"
mark end first_step
echo "BENCH ready $(hostname)"
# Training after the first step (--train-s): the image's background fill runs now.
if [ "${BENCH_TRAIN_S:-0}" != 0 ]; then
  sleep "$BENCH_TRAIN_S"
fi

if [ "${BENCH_SAVE:-0}" = 1 ] && [ "${SLURM_PROCID:-0}" = 0 ]; then
  mark start ckpt_save
  cp "$BENCH_DIR/ckpt.bin" "$BOOTSEER_CKPT/model.bin"
  mark end ckpt_save --bytes "$(stat -c %s "$BENCH_DIR/ckpt.bin")"
  echo "BENCH saved $(stat -c %s "$BOOTSEER_CKPT/model.bin")"
fi
