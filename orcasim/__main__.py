"""``python -m orcasim`` runs the command line."""

import sys

from orcasim.cli import main

sys.exit(main())
