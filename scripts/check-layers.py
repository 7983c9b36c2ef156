#!/usr/bin/env python3
"""Checks the import structure of every crate under crates/: fails on any cycle between files,
and, in crates/tollgate, on any import against the layer order of its top-level modules.

Usage: scripts/check-layers.py [ROOT]   (ROOT: the workspace, by default this script's parent)

For each crate, the file-level import graph of its src/ is built from
  - `use` declarations whose path starts with `crate::`, `self::`, `super::` or the name of a
    child module (`use keys::KeyBuf;` after `mod keys;`), braces expanded;
  - paths written in code that start the same way (`crate::store::Charge::new(..)`).
`mod name;` declarations say which files make up the crate (those its root reaches) and where
each module lives; declaring a child is not importing it (a child's `use super::Item;` is not a
cycle, but the parent's `use child::Thing;` back is).
A path is resolved to the file that holds it: the longest prefix that names a module file, then,
when the next name is re-exported there by a named `pub use` (not a glob), the file it was
re-exported from.
Comments, string and character literals are not read, and neither is code under `#[cfg(test)]`
(a test module's `use super::*;` is its own file, and tests may reach any layer to build what
they check). `#[path]` attributes are not followed.

Then it reports, and exits 1 when there is anything to report:
  (a) every strongly connected set of two or more files, with the edges that tie it;
  (b) in crates/tollgate only, every edge between top-level modules that goes upward in LAYERS
      (a module may import only modules at or below its own level), and every top-level module
      that is not in LAYERS at all (unknown: give it a level).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

# The layer order of crates/tollgate, lowest first; one level may hold several modules. The leaf
# utilities sit at the bottom, below policy (tollgate-core, the lowest layer, is its own crate).
# `metrics` counts decisions per rule of a policy (and per failure posture), so it sits right
# above `policy`, not among the leaves.
LAYERED_CRATE = "tollgate"
LAYERS: list[set[str]] = [
    {"clock", "fnv", "random", "observe", "background"},
    {"policy"},
    {"metrics"},
    {"store"},
    {"resilience"},
    {"leases"},
    {"limiter"},
    {"lifecycle"},
    {"service"},
]
LEVEL = {name: level for level, names in enumerate(LAYERS) for name in names}

TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|::|\S")
RAW_STRING = re.compile(r'b?r(#*)"')
CHAR = re.compile(r"'(\\(u\{[0-9A-Fa-f]*\}|x[0-9A-Fa-f]{2}|.)|[^\\'])'", re.S)
KEYWORD_ROOTS = ("crate", "self", "super")


def strip(text: str) -> str:
    """`text` with comments and string/char literals blanked out (newlines kept, so that line
    numbers still hold)."""
    out: list[str] = []
    i, n = 0, len(text)

    def blank(s: str) -> str:
        return "".join("\n" if c == "\n" else " " for c in s)

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(blank(text[i:j]))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(blank(text[i:j]))
            i = j
        elif (m := RAW_STRING.match(text, i)) and (i == 0 or not _ident(text[i - 1])):
            hashes = m.group(1)
            end = text.find('"' + hashes, m.end())
            j = n if end < 0 else end + 1 + len(hashes)
            out.append(blank(text[i:j]))
            i = j
        elif c == '"' or (c == "b" and text.startswith('b"', i) and not _ident_before(text, i)):
            j = i + (2 if c == "b" else 1)
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(blank(text[i : j + 1]))
            i = j + 1
        elif c == "'":
            # A char literal ('a', '\n', '\u{1F600}') or a lifetime ('a), which stays.
            m = CHAR.match(text, i)
            if m:
                out.append(blank(m.group(0)))
                i = m.end()
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _ident(c: str) -> bool:
    return c.isalnum() or c == "_"


def _ident_before(text: str, i: int) -> bool:
    return i > 0 and _ident(text[i - 1])


@dataclass
class Event:
    """One thing a file says: a `mod` declaration, a `use` path or a path in code."""

    kind: str  # "mod" | "use" | "path"
    context: tuple[str, ...]  # the module it is written in (inline modules included)
    path: tuple[str, ...]  # as written
    line: int
    public: bool = False  # a `pub use` (a re-export)
    alias: str | None = None  # the name a `use` binds


@dataclass
class SourceFile:
    rel: str  # relative to the crate, e.g. src/limiter/mod.rs
    module: tuple[str, ...]
    events: list[Event] = field(default_factory=list)
    inline: set[tuple[str, ...]] = field(default_factory=set)


def module_of(rel: Path) -> tuple[str, ...]:
    """The module path of a file under src/: lib.rs and main.rs are the root, `a/mod.rs` and
    `a.rs` are `a`."""
    parts = list(rel.parts)
    last = parts.pop()
    if last in ("mod.rs",) or (not parts and last in ("lib.rs", "main.rs")):
        return tuple(parts)
    return tuple(parts + [last[:-3]])


def parse_use_tree(tokens: list[str]) -> list[tuple[tuple[str, ...], str | None]]:
    """The paths of a `use` tree's tokens (between `use` and `;`), each with the name it binds
    (None for a glob)."""
    pos = 0

    def tree(prefix: tuple[str, ...]) -> list[tuple[tuple[str, ...], str | None]]:
        nonlocal pos
        path = list(prefix)
        if pos < len(tokens) and tokens[pos] == "::":
            pos += 1
        while pos < len(tokens):
            t = tokens[pos]
            if t == "{":
                pos += 1
                found = []
                while pos < len(tokens) and tokens[pos] != "}":
                    found += tree(tuple(path))
                    if pos < len(tokens) and tokens[pos] == ",":
                        pos += 1
                pos += 1
                return found
            if t == "*":
                pos += 1
                return [(tuple(path), None)]
            if not _ident(t[0]):
                break
            pos += 1
            if t == "self" and path and path[-1] not in KEYWORD_ROOTS:
                # `use a::{self}`: a itself.
                pass
            else:
                path.append(t)
            if pos < len(tokens) and tokens[pos] == "::":
                pos += 1
                continue
            break
        alias = path[-1] if path else None
        if pos + 1 < len(tokens) and tokens[pos] == "as":
            alias = tokens[pos + 1]
            pos += 2
        return [(tuple(path), alias)] if path else []

    return tree(())


def parse(rel: str, module: tuple[str, ...], text: str) -> SourceFile:
    source = SourceFile(rel, module)
    code = strip(text)
    tokens: list[tuple[str, int]] = []
    line = 1
    last = 0
    for m in TOKEN.finditer(code):
        line += code.count("\n", last, m.start())
        last = m.start()
        tokens.append((m.group(0), line))

    # Each open brace: the module it opens (None if not a module) and whether it is test code.
    stack: list[tuple[tuple[str, ...] | None, bool]] = []
    context = module
    in_test = False
    pending_test = False
    i = 0
    n = len(tokens)

    def word(k: int) -> str:
        return tokens[k][0] if k < n else ""

    while i < n:
        t, ln = tokens[i]
        if t == "#" and word(i + 1) in ("[", "!"):
            # An attribute: find its closing bracket.
            j = i + 1 if word(i + 1) == "[" else i + 2
            depth, k = 0, j
            while k < n:
                if tokens[k][0] == "[":
                    depth += 1
                elif tokens[k][0] == "]":
                    depth -= 1
                    if depth == 0:
                        break
                k += 1
            attr = " ".join(tok for tok, _ in tokens[j + 1 : k])
            if attr == "cfg ( test )" and word(i + 1) == "[":
                pending_test = True
            i = k + 1
            continue
        if t == "{":
            opened = None
            stack.append((opened, in_test))
            in_test = in_test or pending_test
            pending_test = False
            i += 1
            continue
        if t == "}":
            if stack:
                opened, was_test = stack.pop()
                in_test = was_test
                if opened is not None:
                    context = opened
            pending_test = False
            i += 1
            continue
        if t == ";":
            pending_test = False
            i += 1
            continue
        if t == "mod" and _ident(word(i + 1)[:1] or "-") and word(i + 2) in (";", "{"):
            name = word(i + 1)
            test = in_test or pending_test
            if word(i + 2) == ";":
                if not test:
                    source.events.append(Event("mod", context, (name,), ln))
                pending_test = False
                i += 3
                continue
            # An inline module: remember where to come back to.
            stack.append((context, in_test))
            context = context + (name,)
            source.inline.add(context)
            in_test = test
            pending_test = False
            i += 3
            continue
        if t == "use" and word(i + 1) != "<":
            public = word(i - 1) == "pub" or (
                word(i - 1) == ")" and word(i - 2) in ("crate", "super") and word(i - 4) == "pub"
            )
            j, depth = i + 1, 0
            while j < n and not (tokens[j][0] == ";" and depth == 0):
                if tokens[j][0] == "{":
                    depth += 1
                elif tokens[j][0] == "}":
                    depth -= 1
                j += 1
            if not (in_test or pending_test):
                for path, alias in parse_use_tree([tok for tok, _ in tokens[i + 1 : j]]):
                    source.events.append(Event("use", context, path, ln, public, alias))
            pending_test = False
            i = j + 1
            continue
        if _ident(t[0]) and word(i + 1) == "::" and word(i - 1) != "::":
            path = [t]
            j = i + 1
            while word(j) == "::" and _ident(word(j + 1)[:1] or "-"):
                path.append(word(j + 1))
                j += 2
            if not in_test and not t[0].isupper() and t != "Self":
                source.events.append(Event("path", context, tuple(path), ln))
            i = j
            continue
        i += 1
    return source


@dataclass
class Edge:
    source: str
    target: str
    line: int
    why: str  # the path as written, or `mod name`


class Crate:
    def __init__(self, root: Path, name: str):
        self.root = root
        self.name = name
        self.files: dict[tuple[str, ...], SourceFile] = {}
        src = root / "src"
        found: dict[tuple[str, ...], SourceFile] = {}
        for path in sorted(src.rglob("*.rs")):
            rel = path.relative_to(src)
            module = module_of(rel)
            text = path.read_text(encoding="utf-8", errors="replace")
            found[module] = parse(str(Path("src") / rel), module, text)
        # The crate is the files its root reaches by `mod` declarations (not under cfg(test)).
        reach = [()] if () in found else []
        while reach:
            module = reach.pop()
            if module in self.files or module not in found:
                continue
            self.files[module] = found[module]
            reach += [e.context + e.path for e in found[module].events if e.kind == "mod"]
        self.modules: set[tuple[str, ...]] = set(self.files)
        for f in self.files.values():
            self.modules |= f.inline
        # Re-exports: file module -> name -> the absolute path it stands for.
        self.exports: dict[tuple[str, ...], dict[str, tuple[str, ...]]] = {}
        for f in self.files.values():
            for e in f.events:
                if e.kind == "use" and e.public and e.alias and e.context == f.module:
                    absolute = self.absolute(e.context, e.path)
                    if absolute is not None:
                        self.exports.setdefault(f.module, {})[e.alias] = absolute

    def absolute(self, context: tuple[str, ...], path: tuple[str, ...]) -> tuple[str, ...] | None:
        """`path`, written in module `context`, from the crate root; None for another crate's."""
        if not path:
            return None
        head, rest = path[0], list(path[1:])
        if head == "crate":
            return tuple(rest)
        if head == "self":
            return context + tuple(rest)
        if head == "super":
            base = list(context)
            base.pop() if base else None
            while rest and rest[0] == "super":
                rest.pop(0)
                base.pop() if base else None
            return tuple(base + rest)
        if context + (head,) in self.modules:
            return context + tuple(path)
        return None

    def resolve(self, absolute: tuple[str, ...], depth: int = 0) -> SourceFile | None:
        """The file that holds `absolute`: its longest prefix that is a module file, followed
        through a re-export there."""
        for cut in range(len(absolute), -1, -1):
            prefix = absolute[:cut]
            if prefix in self.files:
                rest = absolute[cut:]
                reexported = self.exports.get(prefix, {}).get(rest[0]) if rest else None
                if reexported is not None and depth < 16 and reexported != absolute:
                    found = self.resolve(reexported + rest[1:], depth + 1)
                    if found is not None:
                        return found
                return self.files[prefix]
        return None

    def edges(self) -> list[Edge]:
        found: dict[tuple[str, str], Edge] = {}
        for f in self.files.values():
            for e in f.events:
                if e.kind == "mod":
                    continue
                absolute = self.absolute(e.context, e.path)
                target = self.resolve(absolute) if absolute is not None else None
                why = "::".join(e.path)
                if target is None or target is f:
                    continue
                found.setdefault((f.rel, target.rel), Edge(f.rel, target.rel, e.line, why))
        return sorted(found.values(), key=lambda e: (e.source, e.target))


def cycles(edges: list[Edge]) -> list[list[str]]:
    """The strongly connected sets of two or more files (Tarjan), each sorted."""
    graph: dict[str, list[str]] = {}
    for e in edges:
        graph.setdefault(e.source, []).append(e.target)
        graph.setdefault(e.target, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        # Iterative, so that a deep tree does not hit Python's recursion limit.
        work = [(v, iter(graph[v]))]
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        while work:
            node, children = work[-1]
            advanced = False
            for w in children:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(graph[w])))
                    advanced = True
                    break
                if w in on_stack:
                    low[node] = min(low[node], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def top_module(rel: str) -> str | None:
    """The top-level module a file belongs to; None for the crate root."""
    module = module_of(Path(rel).relative_to("src"))
    return module[0] if module else None


def check_crate(crate: Crate, layered: bool) -> list[str]:
    problems: list[str] = []
    edges = crate.edges()
    prefix = f"crates/{crate.name}"
    for component in cycles(edges):
        members = set(component)
        problems.append(f"{prefix}: cycle between {len(component)} files: " + ", ".join(component))
        for e in edges:
            if e.source in members and e.target in members:
                problems.append(f"    {e.source}:{e.line} -> {e.target} ({e.why})")
    if not layered:
        return problems
    unknown: dict[str, str] = {}
    for f in sorted(crate.files.values(), key=lambda f: f.rel):
        top = top_module(f.rel)
        if top is not None and top not in LEVEL:
            unknown.setdefault(top, f.rel)
    for top, rel in sorted(unknown.items()):
        problems.append(
            f"{prefix}: unknown top-level module `{top}` ({rel}): not in the layer order"
        )
    for e in edges:
        source, target = top_module(e.source), top_module(e.target)
        if source is None or target is None or source == target:
            continue
        if source in LEVEL and target in LEVEL and LEVEL[target] > LEVEL[source]:
            problems.append(
                f"{prefix}: against the layer order: {e.source}:{e.line} -> {e.target} "
                f"({e.why}): `{source}` may not import `{target}`, a higher layer"
            )
    return problems


def check(root: Path) -> list[str]:
    problems: list[str] = []
    for crate_dir in sorted((root / "crates").iterdir()):
        if (crate_dir / "src").is_dir():
            crate = Crate(crate_dir, crate_dir.name)
            problems += check_crate(crate, layered=crate_dir.name == LAYERED_CRATE)
    return problems


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parent.parent
    problems = check(root)
    for problem in problems:
        print(problem)
    if problems:
        order = " < ".join("/".join(sorted(names)) for names in LAYERS)
        print(f"\nlayer order of crates/{LAYERED_CRATE}: {order}", file=sys.stderr)
        return 1
    print("no import cycles between files; crates/tollgate follows its layer order")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
