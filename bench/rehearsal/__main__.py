"""`python bench/rehearsal ...`: the rehearsal's command line (rehearsal.report.main)."""

import sys
from pathlib import Path

here = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]  # its modules by their package name
sys.path.insert(0, str(here.parent))

from rehearsal.report import main  # noqa: E402

sys.exit(main())
