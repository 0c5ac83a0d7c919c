"""The checkpoint mount daemon: one per job and node, serving a namespace over FUSE."""
