"""The public API list that tests/unit/test_public_api.py holds the code to: (module, name, kind, parameters).

    .venv/bin/python tools/public_api.py            # add the current public names to the list (never drops one)
    .venv/bin/python tools/public_api.py --check    # exit 1 when a listed name is gone or its signature broke
    .venv/bin/python tools/public_api.py --from-tree DIR --since 0.1.0   # record an older release's names
                                                    # (DIR: that release's installed trainledger/ on PYTHONPATH)

The public surface is every ``__all__`` name of the packages users import from (``PUBLIC_MODULES``) and every
module a page of README.md or docs/ imports from; an entry, once listed, stays: a name that moves keeps its old
place importable (``trainledger/_moved.py``) and the entry records where it went (``moved_to``). A parameter
list is held, not frozen: a new parameter with a default, or a parameter caught by ``**kwargs``, is compatible;
a removed or reordered one, or a new one without a default, is not.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import re
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIST = ROOT / "tests" / "unit" / "public_api.json"

PUBLIC_MODULES = ("trainledger", "trainledger.journal", "trainledger.training", "trainledger.ladder",
                  "trainledger.training.distributed", "trainledger.training.experiment",
                  "trainledger.training.integrations.hf", "trainledger.training.integrations.lightning")

_IMPORT = re.compile(r"from\s+(trainledger(?:\.\w+)*)\s+import\s+(\([^)]*\)|[^\n#]+)")


def documented_imports(root: Path = ROOT) -> set[tuple[str, str]]:
    """Every (module, name) that README.md or a page of docs/ imports with ``from trainledger... import``."""
    found: set[tuple[str, str]] = set()
    for page in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        for module, names in _IMPORT.findall(page.read_text(encoding="utf-8")):
            for name in re.split(r"[\s,()]+", names):
                if re.fullmatch(r"[A-Za-z_]\w*", name) and name != "as":
                    found.add((module, name))
    return found


def describe(obj) -> dict:
    """The kind of a public object and, for a callable, its parameters as [name, kind, has_default]."""
    kind = "class" if inspect.isclass(obj) else "function" if callable(obj) else "value"
    entry: dict = {"kind": kind}
    if kind != "value":
        try:
            sig = inspect.signature(obj)
        except (TypeError, ValueError):
            return entry
        entry["signature"] = str(sig)
        entry["params"] = [[p.name, p.kind.name, p.default is not inspect.Parameter.empty]
                           for p in sig.parameters.values()]
    return entry


def incompatible(old: list, new: list) -> list[str]:
    """Why a callable with parameters ``new`` cannot take every call that ``old`` took (empty: it can)."""
    why = []
    positional = ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD")
    new_by_name = {p[0]: p for p in new}
    new_positional = [p for p in new if p[1] in positional]
    takes_kwargs = any(p[1] == "VAR_KEYWORD" for p in new)
    takes_args = any(p[1] == "VAR_POSITIONAL" for p in new)
    old_names = {p[0] for p in old}
    for i, (name, kind, has_default) in enumerate(p for p in old if p[1] in positional):
        if name.startswith("_"):
            continue
        if i >= len(new_positional):
            if not takes_args:
                why.append(f"positional parameter {i} ({name}) is gone")
            continue
        there = new_positional[i]
        if kind == "POSITIONAL_OR_KEYWORD" and there[0] != name:
            why.append(f"positional parameter {i} is {there[0]!r}, was {name!r}")
        elif has_default and not there[2]:
            why.append(f"parameter {name!r} lost its default")
    for name, kind, has_default in old:
        if name.startswith("_") or kind == "POSITIONAL_ONLY":
            continue
        if kind == "VAR_POSITIONAL" and not takes_args:
            why.append("*args is gone")
        elif kind == "VAR_KEYWORD" and not takes_kwargs:
            why.append("**kwargs is gone")
        elif kind in ("KEYWORD_ONLY", "POSITIONAL_OR_KEYWORD"):
            there = new_by_name.get(name)
            if there is None or there[1] not in ("KEYWORD_ONLY", "POSITIONAL_OR_KEYWORD"):
                if not takes_kwargs:
                    why.append(f"keyword {name!r} is gone")
            elif has_default and not there[2]:
                why.append(f"parameter {name!r} lost its default")
    for name, kind, has_default in new:
        if name not in old_names and not has_default and kind not in ("VAR_POSITIONAL", "VAR_KEYWORD"):
            why.append(f"new parameter {name!r} has no default")
    return why


def resolve(module: str, name: str) -> tuple[object, list[str]]:
    """The object at ``module.name`` now and the deprecation warnings reading it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        obj = getattr(importlib.import_module(module), name)
    return obj, [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]


def check(entries: list[dict]) -> list[str]:
    """One line per listed name that is gone or whose signature broke."""
    problems = []
    for e in entries:
        where = f"{e['module']}.{e['name']}"
        try:
            obj, deprecations = resolve(e["module"], e["name"])
        except (ImportError, AttributeError) as exc:
            problems.append(f"{where}: not importable ({exc})")
            continue
        if e.get("moved_to") and not any(e["moved_to"] in d for d in deprecations):
            problems.append(f"{where}: moved to {e['moved_to']}, but reading it gives no DeprecationWarning naming that")
        now = describe(obj)
        if now["kind"] != e["kind"]:
            problems.append(f"{where}: a {now['kind']}, was a {e['kind']}")
        elif e.get("held") != "name" and "params" in e and "params" in now:
            for why in incompatible(e["params"], now["params"]):
                problems.append(f"{where}: {why} (was {e['signature']})")
    return problems


def current(modules) -> list[dict]:
    out = []
    for module in sorted(modules):
        mod = importlib.import_module(module)
        for name in getattr(mod, "__all__", ()):
            obj, _ = resolve(module, name)
            out.append({"module": module, "name": name, **describe(obj)})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="check the list against the code; write nothing")
    ap.add_argument("--from-tree", metavar="DIR", help="an older release's installed tree (its trainledger/ inside DIR)")
    ap.add_argument("--since", default=None, help="the release the recorded names come from (with --from-tree)")
    args = ap.parse_args(argv)
    entries = json.loads(LIST.read_text()) if LIST.exists() else []
    if args.check:
        problems = check(entries)
        print("\n".join(problems) or f"{len(entries)} public names hold")
        return 1 if problems else 0
    known = {(e["module"], e["name"]) for e in entries}
    if args.from_tree:
        sys.path.insert(0, args.from_tree)
        for m in [m for m in sys.modules if m == "trainledger" or m.startswith("trainledger.")]:
            del sys.modules[m]
        found = []
        tree = Path(args.from_tree) / "trainledger"
        for py in sorted(tree.rglob("*.py")):
            parts = py.relative_to(tree.parent).with_suffix("").parts
            if any(p.startswith("_") for p in parts[1:-1]) or (parts[-1].startswith("_") and parts[-1] != "__init__"):
                continue
            module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            if module.endswith(".cli") or module == "trainledger.cli":
                continue          # the command-line modules are the CLI's insides; the commands are the interface
            found.append(module)
        new = [e for e in current(found) if (e["module"], e["name"]) not in known]
        for e in new:
            e["since"] = args.since
    else:
        modules = set(PUBLIC_MODULES) | {m for m, _ in documented_imports()}
        new = [e for e in current(modules) if (e["module"], e["name"]) not in known]
        for e in new:
            e["since"] = args.since or "unreleased"
    entries.extend(new)
    if not args.from_tree:
        from trainledger import _moved

        for e in entries:
            if e["module"] in _moved.MOVED:
                e["moved_to"] = _moved.new_home(e["module"], e["name"])
            else:  # a name moved out of a module that stays: the module's own _MOVED table (name -> new module)
                table = getattr(importlib.import_module(e["module"]), "_MOVED", None)
                if isinstance(table, dict) and e["name"] in table:
                    e["moved_to"] = table[e["name"]]
    entries.sort(key=lambda e: (e["module"], e["name"]))
    LIST.write_text("[\n" + ",\n".join(json.dumps(e, sort_keys=True) for e in entries) + "\n]\n")
    print(f"{len(new)} names added, {len(entries)} listed in {LIST.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
