"""``python -m bootseer.ckptd``: the checkpoint mount daemon (:mod:`bootseer.ckptd.daemon`)."""

import sys

from bootseer.ckptd.daemon import main

sys.exit(main())
