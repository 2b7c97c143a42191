import sys

from tuner.cli import main

sys.exit(main())
