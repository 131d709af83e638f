"""Where the project's reference material lives for tests: `shared/` beside the repository
(CI clones main with shared/ next to it). NPUEMU_SHARED overrides the folder."""

import os
from pathlib import Path

SHARED = Path(os.environ.get("NPUEMU_SHARED", Path(__file__).resolve().parents[1].parent / "shared"))
RKNN_FIXTURES = Path(os.environ.get("NPUEMU_RKNN_FIXTURES", SHARED / "rknn-fixtures"))
VENDOR_CORPUS = Path(os.environ.get("NPUEMU_VENDOR_CORPUS", SHARED / "docs" / "vendor-corpus"))
RKNN_FIXTURES_OPS = Path(os.environ.get("NPUEMU_RKNN_FIXTURES_OPS", SHARED / "rknn-fixtures-ops"))
