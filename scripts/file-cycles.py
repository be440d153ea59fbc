#!/usr/bin/env python3
"""Fail when two source files of one crate import each other, directly or through others.

A file is a module: `src/a.rs` and `src/a/mod.rs` are `a`, `src/a/b.rs` is `a::b`. An edge A -> B
is a path in A that names B: `use crate::b::…`, `crate::b::f()`, `super::…` (from A's parent),
`self::…`. A path names the deepest file module it reaches (`crate::a::b::C` names `a::b` when that
file exists, otherwise `a`). Paths inside an inline `mod x { … }` (tests) start from that inline
module, so their `super::` names the file itself, which is no edge. A re-export (`pub use x::Y`)
is a facade: a path through it names the file that defines Y; but a re-export the file also
uses itself (Y named outside `use` lines) is an import of x. A parent's `mod child;` is no edge either; its `child::X` is. So a child that uses
its parent (`super::X`) while the parent uses the child is a cycle: move X down, or pass it in.

Usage: file-cycles.py CRATE_DIR...    (each has src/); exit 1 and list the cycles if any.
       file-cycles.py --self-test     plants a cycle in a temporary crate and checks it is found.
"""
import os
import re
import sys
import tempfile

STRIP = re.compile(r'//[^\n]*|/\*.*?\*/|(?<!\w)b?r#*"|b?"(?:\\.|[^"\\])*"|b?\'(?:\\.|[^\'\\])\'', re.S)
USE = re.compile(r'(\bpub(?:\s*\([^)]*\))?\s+)?\buse\s+([^;]+);')
PATH = re.compile(r'(?<![\w:])(\w+(?:\s*::\s*\w+)+)')
EXTERNAL = ("<another crate>",)
INLINE_MOD = re.compile(r'\bmod\s+(\w+)\s*\{')


def modules(src):
    """Module path (a tuple) -> file, for every .rs file under src/."""
    out = {}
    # A crate with both lib.rs and main.rs has two roots; the one declaring the modules is ours.
    skip = None
    if all(os.path.exists(os.path.join(src, f)) for f in ("lib.rs", "main.rs")):
        declares = lambda f: re.search(r"^\s*(pub\s+)?mod\s+\w+\s*;", open(os.path.join(src, f)).read(), re.M)
        skip = "lib.rs" if declares("main.rs") else "main.rs"
    for root, _, files in os.walk(src):
        for f in files:
            if f.endswith(".rs") and not (root == src and f == skip):
                rel = os.path.relpath(os.path.join(root, f), src)[:-3].split(os.sep)
                if rel in (["lib"], ["main"]):
                    rel = []
                elif rel[-1] == "mod":
                    rel = rel[:-1]
                out[tuple(rel)] = os.path.join(root, f)
    return out


def strip(text):
    """Comments and string/char literals blanked (same length), so positions still line up."""
    out, pos = [], 0
    for m in STRIP.finditer(text):
        if m.start() < pos:
            continue  # inside a raw string already blanked
        stop = m.end()
        if re.fullmatch(r'b?r#*"', m.group(0)):  # a raw string: up to its quote and hashes
            close = '"' + "#" * m.group(0).count("#")
            stop = text.find(close, m.end())
            stop = len(text) if stop < 0 else stop + len(close)
        out.append(text[pos:m.start()])
        out.append(re.sub(r"[^\n]", " ", text[m.start():stop]))
        pos = stop
    out.append(text[pos:])
    return "".join(out)


def inline_modules(text):
    """(start, end, name) of every inline `mod name { … }`, by brace matching."""
    spans = []
    for m in INLINE_MOD.finditer(text):
        depth, i = 0, m.end() - 1
        while i < len(text):
            depth += text[i] == "{"
            depth -= text[i] == "}"
            if depth == 0:
                break
            i += 1
        spans.append((m.start(), i, m.group(1)))
    return spans


def expand(tree):
    """`crate::a::{self, b::C, d}` -> [['crate','a','b','C'], ['crate','a','d'], ['crate','a']]."""
    # Whitespace goes, except the one of an alias (`x as y`, kept as " as ").
    tree = re.sub(r"\s+", "", re.sub(r"\s+as\s+", "\x00", tree)).replace("\x00", " as ")
    brace = tree.find("{")
    if brace < 0:
        return [tree.split("::")]
    head = tree[:brace].rstrip(":")
    body = tree[brace + 1:tree.rfind("}")]
    parts, depth, cur, itself = [], 0, "", False
    for ch in body + ",":
        if ch == "," and depth == 0:
            cur = cur.strip()
            if cur == "self":
                itself = True  # `use a::{self, …}` names `a` itself
            elif cur:
                parts.append(cur)
            cur = ""
            continue
        depth += ch == "{"
        depth -= ch == "}"
        cur += ch
    heads = head.split("::") if head else []
    return [heads + p for part in parts for p in expand(part)] + ([heads] if heads and itself else [])


def reexports(module, text, mods):
    """Names a file re-exports (`pub use child::X;`) -> the path they come from (absolute)."""
    out = {}
    for m in USE.finditer(strip(text)):
        if m.group(1):
            for segs in expand(m.group(2)):
                name = segs[-1].split(" as ")[-1].strip()
                source = absolute(list(module), [x.split(" as ")[0].strip() for x in segs], mods)
                out[name] = EXTERNAL if source is None else source
    return out


def absolute(base, segs, mods):
    """A path as written in module `base` -> an absolute path, or None if not ours."""
    if segs[0] == "crate":
        return segs[1:]
    if segs[0] not in ("super", "self") and tuple(base + segs[:1]) not in mods:
        return None  # std::…, a dependency, a type's associated item: not one of our files
    while segs and segs[0] in ("super", "self"):
        if segs.pop(0) == "super":
            base = base[:-1]
    return base + segs


def owner(full, mods, facades, seen=()):
    """The file an absolute path lands in, looking through re-exports (a facade is not the owner)."""
    if full is None:
        return None
    mod = max((tuple(full[:n]) for n in range(len(full) + 1) if tuple(full[:n]) in mods), key=len)
    rest = full[len(mod):]
    via = facades.get(mod, {}).get(rest[0]) if rest else None
    if via is EXTERNAL:
        return None  # a re-export of another crate's item: no file of ours
    if via is not None and via != full and tuple(full) not in seen:
        return owner(via + rest[1:], mods, facades, seen + (tuple(full),))
    return mod


def edges(module, text, mods, facades):
    """Files named from `module`'s file: {module path: the first path written that names it}."""
    text = strip(text)
    spans = inline_modules(text)
    found = {}

    def scope(pos):
        base = list(module)
        for start, end, name in spans:  # in order of start, so outer before inner
            if start <= pos <= end:
                base.append(name)
        return base

    def add(pos, segs, written):
        target = owner(absolute(scope(pos), segs, mods), mods, facades)
        if target is not None and target != tuple(module):  # a file naming itself is no edge
            found.setdefault(target, written)

    uses = [(m.start(), m.end()) for m in USE.finditer(text)]
    outside = "".join(text[b:a] for (_, b), (a, _) in zip([(0, 0)] + uses, uses + [(len(text), 0)]))
    for m in USE.finditer(text):
        for segs in expand(m.group(2)):
            if not segs:
                continue
            name = segs[-1].split(" as ")[-1].strip()
            # A re-export is a facade (resolved through by owner()), unless the file also uses
            # the item itself: then it imports it like any `use`. (A glob re-export names
            # nothing the file could be seen to use: a facade.)
            if m.group(1) and (name == "*" or not re.search(r"\b%s\b" % re.escape(name), outside)):
                continue
            add(m.start(), [x.split(" as ")[0].strip() for x in segs], " ".join(m.group(0).split()))
    for m in PATH.finditer(text):
        if not any(a <= m.start() < b for a, b in uses):
            add(m.start(), re.sub(r"\s+", "", m.group(1)).split("::"), m.group(1))
    return found


def cycles(crate_dir):
    mods = modules(os.path.join(crate_dir, "src"))
    texts = {m: open(f, encoding="utf-8").read() for m, f in mods.items()}
    facades = {m: reexports(m, t, mods) for m, t in texts.items()}
    named = {m: edges(m, t, mods, facades) for m, t in texts.items()}
    graph = {m: set(e) for m, e in named.items()}
    # Strongly connected components (Tarjan, iterative enough for a crate's few hundred files).
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    # Each cycle with the edges inside it, so the report says which line to change.
    return [([mods[m] for m in comp],
             ["%s -> %s (%s)" % (mods[a], mods[b], named[a][b]) for a in comp for b in comp if b in named[a]])
            for comp in out]


def plant(files, cycle_at, cycle_text, expect):
    """Writes `files` into a temporary crate: no cycle; then appends `cycle_text` to
    `cycle_at`: exactly one cycle, of the files named in `expect`."""
    with tempfile.TemporaryDirectory() as d:
        for name, text in files.items():
            os.makedirs(os.path.dirname(os.path.join(d, "src", name)), exist_ok=True)
            with open(os.path.join(d, "src", name), "w") as f:
                f.write(text)
        assert cycles(d) == [], cycles(d)
        with open(os.path.join(d, "src", cycle_at), "a") as f:
            f.write(cycle_text)
        found = cycles(d)
        assert len(found) == 1 and {os.path.basename(p) for p in found[0][0]} == expect, found


def self_test():
    # Brace lists: `self` names the head, nothing else does; aliases keep their two names.
    assert expand("a::{b, c}") == [["a", "b"], ["a", "c"]], expand("a::{b, c}")
    assert ["a"] in expand("a::{self, b}"), expand("a::{self, b}")
    assert expand("x::index as other") == [["x", "index as other"]], expand("x::index as other")
    # Siblings through a nested child, `super::super::`, a brace list, comments and strings.
    plant({
        "lib.rs": "mod a; mod b;\n// crate::b in a comment is no edge\n",
        "a.rs": "mod c;\nuse crate::b::{Thing, other::{X}};\nfn f() { let s = \"crate::b\"; }\n",
        "a/c.rs": "use super::super::b;\n",
        "b.rs": "pub struct Thing;\n#[cfg(test)]\nmod tests { use super::*; }\n",
    }, "b.rs", "fn g() { crate::a::c::h(); }\n", {"b.rs", "c.rs"})
    # A parent that re-exports its child's item is a facade; one that calls into it while the
    # child uses the parent is a cycle.
    plant({
        "lib.rs": "mod p;\n",
        "p.rs": "mod q;\npub use q::Thing;\npub struct Ctx;\n",
        "p/q.rs": "use super::Ctx;\npub struct Thing;\npub fn helper() {}\n",
    }, "p.rs", "fn route() { q::helper(); }\n", {"p.rs", "q.rs"})
    # A re-export the parent also uses itself is an import: with the child using the parent,
    # a cycle.
    plant({
        "lib.rs": "mod p;\npub use p::Thing;\npub struct Client;\nfn start() { Thing::go(); }\n",
        "p.rs": "pub struct Thing;\n",
    }, "p.rs", "fn f(_: crate::Client) {}\n", {"p.rs", "lib.rs"})
    # The same through an alias.
    plant({
        "lib.rs": "mod p;\npub use p::Thing as Other;\npub struct Client;\nfn start() { Other::go(); }\n",
        "p.rs": "pub struct Thing;\n",
    }, "p.rs", "fn f(_: crate::Client) {}\n", {"p.rs", "lib.rs"})
    print("file-cycles self-test: planted cycles are found, the acyclic trees pass")


def main(argv):
    if argv == ["--self-test"]:
        self_test()
        return 0
    bad = 0
    for crate in argv:
        for files, why in cycles(crate):
            bad += 1
            print("file cycle in %s: %s" % (crate, " <-> ".join(files)))
            for line in why:
                print("    " + line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
