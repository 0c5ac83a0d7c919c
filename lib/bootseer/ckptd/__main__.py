"""``python -m bootseer.ckptd``: the checkpoint mount daemon (:mod:`bootseer.ckptd.daemon`)."""

import sys

from bootseer.nonumpy import without_numpy

without_numpy()  # before pyarrow: the daemon never uses NumPy (bootseer.nonumpy)

from bootseer.ckptd.daemon import main  # noqa: E402

sys.exit(main())
