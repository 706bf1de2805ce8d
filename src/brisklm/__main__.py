"""``python -m brisklm``: the ``brisklm`` command."""

from brisklm.cli import main

raise SystemExit(main())
