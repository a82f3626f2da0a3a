#!/usr/bin/env python3
"""Import circles between the modules of a crate: exits 1, naming them, when there are any.

    scripts/import-circles.py exchange/server/src

A file depends on another when it names a path into that file's module: `crate::a::b::Item`,
`super::x`, `self::y`, or a child module's path (`pages::job::JobPage`); the path is followed
as deep as it names modules. `mod x;` declares a child and is not a dependency. A circle is a
group of files each reachable from every other (a strongly connected component of more than one
file), so a `mod.rs` whose children use its items while it uses theirs is a circle too: shared
items belong in a leaf module both sides name.

Text-based (comments and `#[cfg(test)] mod tests` are left out); it reads, never builds.
"""

import os
import re
import sys
from collections import defaultdict

PATH = re.compile(r"(?<![:\w])((?:crate|super|self|[a-z_][a-z0-9_]*)(?:::[A-Za-z_][A-Za-z0-9_]*)+)")
USE_GROUP = re.compile(r"\buse\s+((?:crate|super|self)(?:::[a-z_][a-z0-9_]*)*)::\{([^;]*)\};", re.S)


def modules(root):
    """Every module of the crate at `root`: its path (a tuple) and its source."""
    found = {}
    for folder, _, files in os.walk(root):
        for name in files:
            if not name.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(folder, name), root)[:-3].split(os.sep)
            if rel[-1] in ("mod", "lib", "main"):
                rel = rel[:-1]
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                text = f.read()
            text = re.sub(r"//[^\n]*", "", text)
            text = re.sub(r"#\[cfg\(test\)\]\s*mod tests\s*\{.*", "", text, flags=re.S)
            found[tuple(rel)] = text
    return found


def resolve(known, here, segments):
    """The deepest module a path names, or None for a path outside the crate."""
    head, rest = segments[0], segments[1:]
    if head == "crate":
        at = ()
    elif head == "super":
        at = here[:-1]
        while rest and rest[0] == "super":
            at, rest = at[:-1], rest[1:]
    elif head == "self":
        at = here
    elif here + (head,) in known:
        at, rest = here + (head,), rest
    else:
        return None
    for segment in rest:
        if at + (segment,) not in known:
            break
        at = at + (segment,)
    return at


def dependencies(known):
    edges = defaultdict(set)
    for here, text in known.items():
        paths = [m.group(1).split("::") for m in PATH.finditer(text)]
        for m in USE_GROUP.finditer(text):
            base = m.group(1).split("::")
            for item in re.findall(r"(?<![:\w])([A-Za-z_][A-Za-z0-9_]*)", m.group(2)):
                paths.append(base + [item])
        for segments in paths:
            there = resolve(known, here, segments)
            if there is not None and there != here:
                edges[here].add(there)
    return edges


def circles(nodes, edges):
    """Strongly connected components of more than one node (Tarjan, iterative)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    counter = 0
    for start in sorted(nodes):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            advanced = False
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(edges.get(nxt, ())))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: import-circles.py CRATE_SRC_DIR")
    known = modules(sys.argv[1])
    found = circles(known, dependencies(known))
    for group in found:
        print("circle:", " <-> ".join("/".join(m) or "lib" for m in group))
    print(f"{len(found)} import circles among {len(known)} files of {sys.argv[1]}")
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()
