"""The import graph of trainledger's own modules: cycles, package arrows, private imports across packages, depth.

Every ``import`` and ``from ... import`` in the source is an edge, at module level or inside a function alike (a
lazy import is still a dependency: it only moves the failure to run time). Modules are named as installed
(``trainledger.journal.merkle`` is ``journal/merkle.py``); the four packages are ``trainledger``
(the installed face), ``journal``, ``training`` and ``ladder``.

Rules it checks (exit 1 when one is broken, with each offence on a line):

- no cycle among modules (strongly connected components of more than one module);
- the packages' arrows point one way: ``journal`` imports neither ``training``, ``ladder`` nor the face,
  ``training`` does not import ``ladder`` or the face, ``ladder`` does not import the face;
- no module imports another package's private module (``trainledger.journal.scan`` from ``training/``) or a
  private name from it (``from trainledger.journal.codec import _decoder``);
- inside a package, folders are layers (:data:`LAYERS`, lowest first; ``.`` is the package's own files): a module
  imports only from its own layer's folder or from layers below it, never from a layer above nor from a folder
  beside it in the same layer. A package's ``__init__`` and ``__main__`` are its face and may import any layer.

    .venv/bin/python tools/import_graph.py            # summary; exit 1 on a broken rule
    .venv/bin/python tools/import_graph.py --json     # the graph and the findings, for tests
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"trainledger": "src/trainledger", "journal": "journal", "training": "training", "ladder": "ladder"}
#: which package may import which (the face may import everything)
ALLOWED = {"journal": {"journal"}, "training": {"journal", "training"}, "ladder": {"journal", "training", "ladder"},
           "trainledger": {"journal", "training", "ladder", "trainledger"}}


#: each package's layers, lowest first; a tuple holds folders beside each other (neither imports the other).
#: ``.`` is the package's own files: the format core in ``journal``, the entry points (Recorder, watch) in
#: ``training``, the shared audit and report in the face; a file named here (``kinds.py``: a package's event kinds)
#: is a layer of its own. docs/DEVELOPERS.md draws them.
LAYERS: dict[str, list[tuple[str, ...]]] = {
    "journal": [(".",), ("proofs",), ("audit",), ("backends",), ("statements",), ("views",)],
    "training": [("kinds.py",), ("health",), ("audit",), ("checkpoints",), ("reference",), ("distributed",), ("experiment",),
                 ("integrations",), (".",)],
    "ladder": [("kinds.py",), (".",)],
    "trainledger": [(".",), ("serve",), ("cli",)],
}


def layer_of(mod: str, mods: dict[str, Path]) -> tuple[str, str] | None:
    """(package, folder) of a module: its first folder below the package, or ``.`` for the package's own files;
    None for the package's face (``__init__``, ``__main__``)."""
    pkg = package_of(mod)
    rel = mods[mod].relative_to(ROOT / PACKAGES[pkg]).parts
    if len(rel) == 1:
        if rel[0] in ("__init__.py", "__main__.py"):
            return None
        return (pkg, rel[0]) if any(rel[0] in layer for layer in LAYERS[pkg]) else (pkg, ".")
    return pkg, rel[0]


def rank_of(pkg: str, folder: str) -> int | None:
    for i, layer in enumerate(LAYERS[pkg]):
        if folder in layer:
            return i
    return None


def layer_findings(mods: dict[str, Path], es: list[tuple[str, str, str, int]]) -> list[str]:
    """One line per import that goes up a layer or sideways between folders of one layer, and per folder that
    :data:`LAYERS` does not place."""
    out = []
    for mod in mods:
        where = layer_of(mod, mods)
        if where is not None and rank_of(*where) is None:
            out.append(f"{mods[mod].relative_to(ROOT)}: the folder {where[1]!r} of {where[0]} is in no layer "
                       "(tools/import_graph.py LAYERS)")
    for a, b, _, line in es:
        la, lb = layer_of(a, mods), layer_of(b, mods)
        if la is None or lb is None or la[0] != lb[0] or la[1] == lb[1]:
            continue
        ra, rb = rank_of(*la), rank_of(*lb)
        if ra is None or rb is None or ra > rb:
            continue
        how = "a layer above it" if rb > ra else "a folder beside it in its layer"
        out.append(f"{mods[a].relative_to(ROOT)}:{line}: {a} imports {b}: {la[0]}/{lb[1]} is {how} "
                   f"({la[0]}/{la[1]} stands only on the layers below it)")
    return out


def layer_picture() -> list[str]:
    """Each package's layers, lowest first, as one line each."""
    return [f"  {pkg}: " + " <- ".join(" | ".join(f if f != "." else "(own files)" for f in layer)
                                        for layer in layers) for pkg, layers in LAYERS.items()]


def modules() -> dict[str, Path]:
    """Installed module name -> source file, for every ``.py`` file of the four packages."""
    out = {}
    for pkg, folder in PACKAGES.items():
        base = ROOT / folder
        for f in sorted(base.rglob("*.py")):
            rel = f.relative_to(base).with_suffix("").parts
            if rel[-1] == "__init__":
                rel = rel[:-1]
            prefix = ["trainledger"] if pkg == "trainledger" else ["trainledger", pkg]
            out[".".join(prefix + list(rel))] = f
    return out


def package_of(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ("journal", "training", "ladder") else "trainledger"


def _resolve(mod: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def edges(mods: dict[str, Path]) -> list[tuple[str, str, str, int]]:
    """(importer, imported module, imported name or '', line) for every import of one of our modules."""
    out = []
    for mod, f in mods.items():
        is_pkg = f.name == "__init__.py"
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name in mods or a.name.startswith("trainledger."):
                        target = a.name
                        while target not in mods and "." in target:
                            target = target.rsplit(".", 1)[0]
                        out.append((mod, target, "", node.lineno))
            elif isinstance(node, ast.ImportFrom):
                src = _resolve(mod, is_pkg, node)
                if not (src == "trainledger" or src.startswith("trainledger.")):
                    continue
                for a in node.names:
                    sub = f"{src}.{a.name}"
                    if sub in mods:  # from package import module
                        out.append((mod, sub, "", node.lineno))
                    elif src in mods:
                        out.append((mod, src, a.name, node.lineno))
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]; counter[0] += 1
        stack.append(root); on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]; counter[0] += 1
                    stack.append(w); on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop(); on.discard(w); comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def depth(graph: dict[str, set[str]]) -> tuple[int, list[str]]:
    """The longest import chain (in an acyclic graph), and one chain of that length."""
    memo: dict[str, list[str]] = {}

    def longest(v: str, seen: frozenset) -> list[str]:
        if v in memo:
            return memo[v]
        best: list[str] = []
        for w in graph.get(v, ()):
            if w not in seen:
                c = longest(w, seen | {w})
                if len(c) > len(best):
                    best = c
        memo[v] = [v] + best
        return memo[v]

    chains = [longest(v, frozenset({v})) for v in sorted(graph)]
    top = max(chains, key=len, default=[])
    return len(top), top


def analyse() -> dict:
    mods = modules()
    es = edges(mods)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    findings = []
    for a, b, name, line in es:
        if a == b:
            continue
        if b in mods and (b, a) != (a, b):
            # a package's __init__ is its face: importing a name from it is not importing a private module
            graph[a].add(b)
        pa, pb = package_of(a), package_of(b)
        where = f"{mods[a].relative_to(ROOT)}:{line}"
        if pb not in ALLOWED[pa]:
            findings.append(f"{where}: {a} imports {b} ({pa} may not import {pb})")
        if pa != pb:
            private_mod = any(p.startswith("_") and not p.startswith("__") for p in b.split(".")[1:])
            if private_mod:
                findings.append(f"{where}: {a} imports the private module {b} of {pb}")
            elif name.startswith("_") and not name.startswith("__"):
                findings.append(f"{where}: {a} imports the private name {name} from {b}")
    # a package importing its own __init__ (the lazy face) is not a cycle worth reporting: drop __init__ edges
    # that point back up to an ancestor package
    acyclic = {a: {b for b in bs if not a.startswith(b + ".")} for a, bs in graph.items()}
    cyc = cycles(acyclic)
    for c in cyc:
        findings.append("cycle: " + " -> ".join(c))
    findings += layer_findings(mods, es)
    findings = list(dict.fromkeys(findings))
    private_inside = sorted({f"{mods[a].relative_to(ROOT)}:{line}: {name} from {b}" for a, b, name, line in es
                             if name.startswith("_") and not name.startswith("__") and package_of(a) == package_of(b)})
    d, chain = depth(acyclic) if not cyc else (None, [])
    arrows: dict[str, int] = {}
    for a, b, _, _ in es:
        if package_of(a) != package_of(b):
            k = f"{package_of(a)} -> {package_of(b)}"
            arrows[k] = arrows.get(k, 0) + 1
    return {"modules": len(mods), "edges": sum(len(v) for v in acyclic.values()), "arrows": dict(sorted(arrows.items())),
            "depth": d, "deepest": chain, "cycles": cyc, "findings": findings, "private_names_inside": private_inside,
            "graph": {k: sorted(v) for k, v in sorted(acyclic.items())}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print the graph and the findings as JSON")
    args = ap.parse_args(argv)
    res = analyse()
    if args.json:
        print(json.dumps(res, indent=1))
    else:
        print(f"{res['modules']} modules, {res['edges']} import edges between them")
        for k, n in res["arrows"].items():
            print(f"  {k}: {n}")
        if res["depth"] is not None:
            print(f"deepest import chain: {res['depth']} modules ({' -> '.join(res['deepest'])})")
        print(f"private names imported inside their own package: {len(res['private_names_inside'])}")
        print("layers, lowest first (each imports only from itself and the layers to its left):")
        for line in layer_picture():
            print(line)
        for f in res["findings"]:
            print(f)
        print(f"{len(res['findings'])} rule(s) broken" if res["findings"] else "no cycle, no arrow the wrong way, "
              "no private import across packages, no import up or across a layer")
    return 1 if res["findings"] else 0


if __name__ == "__main__":
    sys.exit(main())
