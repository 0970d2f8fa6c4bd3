"""No import circles between the modules of radixserve.

Every import counts: at the top of a module, inside a function, under `TYPE_CHECKING`.
The layers between packages are `lint-imports`' contract (pyproject.toml,
docs/ARCHITECTURE.md); this is the finer rule inside them: no two modules import each
other, directly or through others.
"""

from __future__ import annotations

import grimp
import networkx as nx

import radixserve


def import_cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Groups of more than one module that reach each other through imports (the strongly
    connected components of the import graph)."""
    g = nx.DiGraph()
    for m in graph.modules:
        g.add_node(m)
        g.add_edges_from((m, imported) for imported in graph.find_modules_directly_imported_by(m))
    return [sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1]


def describe(graph: grimp.ImportGraph, component: list[str]) -> str:
    members = set(component)
    lines = []
    for m in component:
        for imported in sorted(graph.find_modules_directly_imported_by(m) & members):
            for d in graph.get_import_details(importer=m, imported=imported):
                lines.append(f"  {m}:{d['line_number']} {d['line_contents']}")
    return "\n".join(lines)


def test_import_cycles_on_a_small_graph() -> None:
    graph = grimp.ImportGraph()
    for a, b in ["ab", "bc", "ca", "cd", "de", "ed"]:
        graph.add_import(importer=f"p.{a}", imported=f"p.{b}")
    graph.add_import(importer="p.f", imported="p.a")
    assert sorted(import_cycles(graph)) == [["p.a", "p.b", "p.c"], ["p.d", "p.e"]]


def test_no_import_cycles_between_modules() -> None:
    graph = grimp.build_graph(radixserve.__name__, exclude_type_checking_imports=False, cache_dir=None)
    cycles = import_cycles(graph)
    assert not cycles, "modules that import each other:\n" + "\n\n".join(describe(graph, c) for c in cycles)
