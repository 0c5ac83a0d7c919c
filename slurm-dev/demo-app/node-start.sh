#!/bin/sh
# One node's start of the demo job (one task per node).
set -eu
mark() { bootseer phase "$@" >/dev/null; }

# The container: squashfuse mounts the image bootseer hands the job (lazy, and from the
# second run on prefetched from the first run's trace), and its entry point runs.
mark start container_start
mnt=$(mktemp -d)
squashfuse "$BOOTSEER_IMAGE" "$mnt"
trap 'fusermount3 -u "$mnt"; rmdir "$mnt"' EXIT
/usr/bin/python3 "$mnt/app/start.py" "$BOOTSEER_IMAGE"
mark end container_start

# The dependencies: installed by the first run (and captured by its epilog), restored
# by the prolog of later runs, which makes this a no-op.
bootseer deps run -- "$BOOTSEER_DEMO/demo-app/install.sh" 2>&1

# The checkpoint, through the striped mount, once a run has saved one.
if [ -f "$BOOTSEER_CKPT/demo/model.bin" ]; then
  mark start ckpt_load
  n=$(cat "$BOOTSEER_CKPT/demo/model.bin" | wc -c)  # reads it all
  mark end ckpt_load --bytes "$n"
  echo "loaded $n bytes from $BOOTSEER_CKPT/demo/model.bin"
fi

# The first training step ends startup (and the image's block trace).
mark start first_step
"$BOOTSEER_DEPS_PREFIX/bin/python" -c 'import demo_ext; print(f"first step: loss {demo_ext.train_step(1000):.4f}")'
mark end first_step
