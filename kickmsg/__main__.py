"""``python -m kickmsg``: the ``kickmsg`` command."""
import sys

from kickmsg.cli import main

sys.exit(main())
