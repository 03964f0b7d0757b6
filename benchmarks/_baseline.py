"""An earlier headway, importable beside this one: before/after rows in one interleaved run.

``baseline(rev)`` extracts ``src/headway`` at git revision ``rev`` into a temporary
folder as the package ``headway_base`` (its imports, the module paths in its strings
and its ``importlib.resources`` lookups renamed, nothing else), puts that folder on
``sys.path`` and imports it. Its Lua scripts are other Redis functions (named after
their text), so both versions run on one server side by side. ``same_policy`` rebuilds
a policy of this headway with the baseline's classes.
"""

from __future__ import annotations

import atexit
import dataclasses
import importlib
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[1]
NAME = "headway_base"
_RENAMES = (
    (re.compile(r"\b(from|import) headway\b"), rf"\1 {NAME}"),
    (re.compile(r'resources\.files\("headway"\)'), f'resources.files("{NAME}")'),
    # Module paths in strings: the package's lazy attributes (``__getattr__``), loggers.
    (re.compile(r'"headway\.'), f'"{NAME}.'),
)


def baseline(rev: str) -> ModuleType:
    """headway as it was at ``rev``, imported as ``headway_base``."""
    folder = Path(tempfile.mkdtemp(prefix="headway-base-"))
    atexit.register(shutil.rmtree, folder, True)
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", rev, "src/headway"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    package = folder / NAME
    (folder / "src" / "headway").rename(package)
    for path in package.rglob("*.py"):
        text = path.read_text("utf-8")
        for pattern, replacement in _RENAMES:
            text = pattern.sub(replacement, text)
        path.write_text(text, "utf-8")
    sys.path.insert(0, str(folder))
    lib = importlib.import_module(NAME)
    if not lib.SyncRateLimiter.__module__.startswith(NAME):
        raise RuntimeError(f"{NAME} still reaches this headway's modules")
    return lib


def same_policy(base: ModuleType, policy: Any) -> Any:
    """``policy`` (this headway's) made with ``base``'s class of the same name."""
    fields = {f.name: getattr(policy, f.name) for f in dataclasses.fields(policy) if f.init}
    return getattr(base, type(policy).__name__)(**fields)
