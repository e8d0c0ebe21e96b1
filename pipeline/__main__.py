"""`python -m pipeline <stage> ...`"""

import sys

from pipeline.cli import main

sys.exit(main())
