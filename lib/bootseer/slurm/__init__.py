"""What bootseer reads of Slurm's configuration: slurm.conf and ``scontrol show config``
(:mod:`~bootseer.slurm.conf`), plugstack.conf (:mod:`~bootseer.slurm.plugstack`), and
whether the running Slurm checks a job's account (:mod:`~bootseer.slurm.accounts`)."""
