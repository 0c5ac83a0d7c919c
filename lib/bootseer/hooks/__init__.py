"""The Prolog and Epilog: run the steps a job asked for, each under a deadline.

``prolog/bootseer-prolog`` and ``epilog/bootseer-epilog`` are shell scripts that leave
at once for jobs that did not ask for bootseer, and otherwise run
``python -m bootseer.hooks prolog|epilog``, which lands in :func:`bootseer.hooks.main.main`.
"""
