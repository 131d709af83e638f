"""Where the project's reference material lives for tests: `shared/` beside the repository
(CI clones main with shared/ next to it). NPUEMU_SHARED overrides the folder.

In a plain clone the folder is absent: tests that read it are skipped with
:data:`MISSING_REASON` (tests/conftest.py finds them), the rest run."""

import os
from pathlib import Path

#: where a plain clone's tests look without NPUEMU_SHARED (some modules name it directly)
BESIDE = Path(__file__).resolve().parents[1].parent / "shared"
SHARED = Path(os.environ.get("NPUEMU_SHARED", BESIDE))
RKNN_FIXTURES = Path(os.environ.get("NPUEMU_RKNN_FIXTURES", SHARED / "rknn-fixtures"))
VENDOR_CORPUS = Path(os.environ.get("NPUEMU_VENDOR_CORPUS", SHARED / "docs" / "vendor-corpus"))
RKNN_FIXTURES_OPS = Path(os.environ.get("NPUEMU_RKNN_FIXTURES_OPS", SHARED / "rknn-fixtures-ops"))

#: the folders a test may read, each checked on its own (an override may point elsewhere)
ROOTS = (RKNN_FIXTURES, VENDOR_CORPUS, RKNN_FIXTURES_OPS, SHARED, BESIDE)

MISSING_REASON = "needs ../shared (NPUEMU_SHARED)"


def missing_root(path: os.PathLike | str) -> Path | None:
    """The shared folder ``path`` lies in when that folder is absent, else None (present, or
    ``path`` is not shared data)."""
    try:
        resolved = Path(os.path.abspath(path))
    except (TypeError, ValueError):
        return None
    for root in ROOTS:
        absolute = Path(os.path.abspath(root))
        if resolved == absolute or absolute in resolved.parents:
            return None if absolute.is_dir() else absolute
    return None
