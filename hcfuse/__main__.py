import sys

from hcfuse.cli import main

sys.exit(main())
