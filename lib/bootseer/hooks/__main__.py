import sys

from bootseer.hooks.main import main

sys.exit(main(sys.argv[1:]))
