import sys

from bootseer.nonumpy import without_numpy

without_numpy()  # before pyarrow: the hooks never use NumPy (bootseer.nonumpy)

from bootseer.hooks.main import main  # noqa: E402

sys.exit(main(sys.argv[1:]))
