"""No import circles between the modules of radixserve.

Every import counts: at the top of a module, inside a function, under `TYPE_CHECKING`.
The layers between packages are `lint-imports`' contract (pyproject.toml,
docs/ARCHITECTURE.md); this is the finer rule inside them: no two modules import each
other, directly or through others.
"""

from __future__ import annotations

import grimp

import radixserve

# removed by the sched/ restructuring
KNOWN_CYCLES: set[frozenset[str]] = {
    frozenset({"radixserve.sched.admission", "radixserve.sched.process", "radixserve.sched.scheduler"}),
}


def import_cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, iterative)."""
    edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in sorted(graph.modules)}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in edges:
        if start in index:
            continue
        work = [(start, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            if i < len(edges[node]):
                work.append((node, i + 1))
                nxt = edges[node][i]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if work:  # back in the caller: pass this node's low link up
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    component.append(m)
                    if m == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def describe(graph: grimp.ImportGraph, component: list[str]) -> str:
    members = set(component)
    lines = []
    for m in component:
        for imported in sorted(graph.find_modules_directly_imported_by(m) & members):
            for d in graph.get_import_details(importer=m, imported=imported):
                lines.append(f"  {m}:{d['line_number']} {d['line_contents']}")
    return "\n".join(lines)


def test_import_cycles_tarjan_on_a_small_graph() -> None:
    graph = grimp.ImportGraph()
    for a, b in ["ab", "bc", "ca", "cd", "de", "ed"]:
        graph.add_import(importer=f"p.{a}", imported=f"p.{b}")
    graph.add_import(importer="p.f", imported="p.a")
    assert sorted(import_cycles(graph)) == [["p.a", "p.b", "p.c"], ["p.d", "p.e"]]


def test_no_import_cycles_between_modules() -> None:
    graph = grimp.build_graph(radixserve.__name__, exclude_type_checking_imports=False, cache_dir=None)
    cycles = import_cycles(graph)
    unknown = [c for c in cycles if frozenset(c) not in KNOWN_CYCLES]
    assert not unknown, "modules that import each other:\n" + "\n\n".join(describe(graph, c) for c in unknown)
    gone = KNOWN_CYCLES - {frozenset(c) for c in cycles}
    assert not gone, f"no longer circles, delete them from KNOWN_CYCLES: {sorted(map(sorted, gone))}"
