"""No import cycle between any two modules of bootseer, each cycle named import by import.

import-linter's acyclic_siblings contract sees the children of each package; a cycle that
runs through a package's own ``__init__`` (``ckpt/__init__`` imports ``ckpt.names``, which
imports ``bootseer.ckpt`` back) or through the root's is invisible to it, and Python meets
it as a partly initialised module. Here every module is a node and every import an edge:
inside functions and under TYPE_CHECKING too.

    scripts/layering.py [LIB]     LIB: the directory holding bootseer/ (default: lib/)
"""

from __future__ import annotations

import importlib.util
import itertools
import sys
from pathlib import Path

import grimp

PACKAGE = "bootseer"


def load(lib: Path) -> grimp.ImportGraph:
    """The import graph of ``LIB/bootseer``, never of another copy on sys.path."""
    sys.path.insert(0, str(lib))
    spec = importlib.util.find_spec(PACKAGE)
    origin = Path(spec.origin).resolve() if spec and spec.origin else None
    if origin is None or origin.parent != (lib / PACKAGE).resolve():
        raise SystemExit(f"layering: {PACKAGE} resolves to {origin}, not to {lib / PACKAGE}")
    return grimp.build_graph(PACKAGE, exclude_type_checking_imports=False, cache_dir=None)


def cyclic_components(graph: grimp.ImportGraph) -> list[list[str]]:
    """The modules that import themselves through others, grouped by strongly connected
    component: a module's component is what it imports (even indirectly) that imports it."""
    seen: set[str] = set()
    components = []
    for module in sorted(graph.modules):
        if module in seen:
            continue
        up = graph.find_upstream_modules(module)
        down = graph.find_downstream_modules(module)
        if up & down:
            component = sorted(up & down | {module})
            seen.update(component)
            components.append(component)
    return components


def shortest_cycle(graph: grimp.ImportGraph, module: str) -> list[str]:
    """``module`` -> ... -> ``module``, as few imports as there can be."""
    best: tuple[str, ...] = ()
    for imported in sorted(graph.find_modules_directly_imported_by(module)):
        back = graph.find_shortest_chain(importer=imported, imported=module)
        if back and (not best or len(back) < len(best)):
            best = back
    return [module, *best]


def describe(graph: grimp.ImportGraph, lib: Path, importer: str, imported: str) -> str:
    details = graph.get_import_details(importer=importer, imported=imported)
    where = ", ".join(
        f"l.{d['line_number']}: {d['line_contents']}"
        for d in sorted(details, key=lambda d: d["line_number"])
    )
    path = lib.joinpath(*importer.split("."))
    file = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    return f"  {importer} -> {imported}   ({file.relative_to(lib)} {where})"


def main(argv: list[str]) -> int:
    top = Path(__file__).resolve().parents[1]
    lib = Path(argv[1]).resolve() if len(argv) > 1 else top / "lib"
    graph = load(lib)
    components = cyclic_components(graph)
    if not components:
        print(f"no import cycle among the {len(graph.modules)} modules of {PACKAGE}")
        return 0
    for component in components:
        print(f"import cycle among {len(component)} modules: {', '.join(component)}")
        cycle = shortest_cycle(graph, component[0])
        for importer, imported in itertools.pairwise(cycle):
            print(describe(graph, lib, importer, imported))
    print(f"{len(components)} import cycle(s) among the modules of {PACKAGE}")
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
