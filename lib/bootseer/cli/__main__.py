import sys

from bootseer.cli import main

sys.exit(main())
