"""Load a script of tools/ as a module, by its path (tools/ is not a package and never goes on sys.path)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

TOOLS = Path(__file__).resolve().parents[2] / "tools"


def load_tool(name: str) -> ModuleType:
    """``tools/NAME.py``, imported once under the name ``tool_NAME``."""
    key = f"tool_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, TOOLS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module  # dataclasses look their module up while the class is made
        spec.loader.exec_module(module)
    return sys.modules[key]
