import sys

from rlstab.cli import main

sys.exit(main())
