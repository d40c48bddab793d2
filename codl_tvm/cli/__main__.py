"""``python -m codl_tvm.cli``: the ``codl-tvm`` command."""

import sys

from codl_tvm.cli import main

sys.exit(main())
