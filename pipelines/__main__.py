from __future__ import annotations

import sys

from pipelines.cli import main

sys.exit(main())
