"""The checkpoint mount daemon (``python -m bootseer.ckptd``): one per job and node,
serving a namespace over FUSE. :mod:`~bootseer.ckptd.daemon` is the process,
:mod:`~bootseer.ckptd.fs` the filesystem, :mod:`~bootseer.ckptd.log` its log,
:mod:`~bootseer.ckptd.counts` and :mod:`~bootseer.ckptd.metrics` what it counts."""
