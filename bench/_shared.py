"""What the benches share with the tests: the local-cluster recipe and the polling helper.

Their one copy lives in tests/ (tests/local_recipe.py, tests/polling.py), so the tests never
import bench/; this module puts tests/ on the path, as pytest does, and re-exports them.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from local_recipe import SHARED_STEPS_ENV, local_recipe
from polling import wait_until

__all__ = ["SHARED_STEPS_ENV", "local_recipe", "wait_until"]
