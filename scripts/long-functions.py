#!/usr/bin/env python3
"""Fail on a function of 100 lines or more that does not say why it is that long.

A reader holds a function of a screen or two; a longer one is split into named steps, unless
it is one flat table or sequence (a match over every variant, a list of checks), which a
comment just above it or at the top of its body says, starting with `Long:` (e.g. `// Long: one flat table of
every metric family`). Tests are not counted (`#[cfg(test)]` modules, `tests/`, `*/tests.rs`).

Usage: long-functions.py DIR...       (every .rs under each DIR's src/)
       long-functions.py --self-test
"""
import importlib.util
import os
import re
import sys
import tempfile

LIMIT = 100
FN = re.compile(r"\bfn\s+(\w+)")
TEST_MOD = re.compile(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{")

spec = importlib.util.spec_from_file_location(
    "file_cycles", os.path.join(os.path.dirname(os.path.abspath(__file__)), "file-cycles.py"))
file_cycles = importlib.util.module_from_spec(spec)
spec.loader.exec_module(file_cycles)


def close(text, open_at):
    """The index of the brace closing the one at `open_at`."""
    depth = 0
    for i in range(open_at, len(text)):
        depth += text[i] == "{"
        depth -= text[i] == "}"
        if depth == 0:
            return i
    return len(text) - 1


def body_start(text, at):
    """Where the body of the function whose signature starts at `at` opens: the first `{`
    outside parentheses and brackets (parameters, array types), or None for a declaration
    (`;`) such as a trait method without a body."""
    depth = 0
    for i in range(at, len(text)):
        c = text[i]
        if c in "([":
            depth += 1
        elif c in ")]":
            depth -= 1
        elif depth == 0 and c == ";":
            return None
        elif depth == 0 and c == "{":
            return i
    return None


def explained(lines, first, body, last):
    """Whether a `// Long:` comment says why: in the comments and attributes right above the
    function (line `first`; the block ends at a blank line or the end of another item), or in
    the first lines of its body (from line `body`)."""
    i = first - 1
    while i >= 0 and lines[i].strip() and not lines[i].rstrip().endswith(("}", ";", "{")):
        if re.match(r"\s*//[/!]?\s*Long:", lines[i]):
            return True
        i -= 1
    return any(re.match(r"\s*//\s*Long:", l) for l in lines[body:min(body + 6, last + 1)])


def long_functions(path):
    raw = open(path, encoding="utf-8").read()
    text = file_cycles.strip(raw)
    tests = [(m.start(), close(text, m.end() - 1)) for m in TEST_MOD.finditer(text)]
    lines = raw.split("\n")
    for m in FN.finditer(text):
        if any(a <= m.start() <= b for a, b in tests):
            continue
        opening = body_start(text, m.end())
        if opening is None:
            continue
        end = close(text, opening)
        first, last = text.count("\n", 0, m.start()), text.count("\n", 0, end)
        body = text.count("\n", 0, opening)
        n = last - first + 1
        if n >= LIMIT and not explained(lines, first, body, last):
            yield path, first + 1, m.group(1), n


def check(dirs):
    found = []
    for d in dirs:
        for root, _, files in os.walk(os.path.join(d, "src")):
            for f in sorted(files):
                if f.endswith(".rs") and f != "tests.rs":
                    found.extend(long_functions(os.path.join(root, f)))
    return found


def self_test():
    body = "\n".join("    let x%d = %d;" % (i, i) for i in range(LIMIT))
    with tempfile.TemporaryDirectory() as d:
        os.makedirs(os.path.join(d, "src"))
        src = os.path.join(d, "src", "lib.rs")

        def found(text):
            with open(src, "w") as f:
                f.write(text)
            return [(x[2], x[3]) for x in check([d])]

        tests = ("#[cfg(test)]\nmod tests {\n    fn long_test() {\n" + body + "\n    }\n}\n")
        assert found("/// Short.\nfn short() { let s = \"}\"; }\n" + tests) == []
        planted = "fn planted(a: u32) -> u32 {\n" + body + "\n    a\n}\n"
        assert found(planted) == [("planted", LIMIT + 3)]
        # Signatures with `;` or braces in them: array types, destructured parameters.
        assert found("fn arr(k: [u8; 24]) -> [u8; 2] {\n" + body + "\n}\n") == [("arr", LIMIT + 2)]
        assert found("fn de(Foo { a }: Foo) {\n" + body + "\n}\n") == [("de", LIMIT + 2)]
        # A neighbour's reason is not this function's.
        neighbour = "fn short() {\n    // Long: not about planted\n}\n"
        assert found(neighbour + planted) == [("planted", LIMIT + 3)]
        assert found("// Long: one flat sequence, said here.\n" + planted) == []
        # A declaration has no body: it does not take the next function's.
        assert found("trait T {\n    fn decl(&self);\n}\n" + planted) == [("planted", LIMIT + 3)]
        # A reason at the top of the body, after a long signature, counts; one deeper does not.
        sig = "fn wide(\n    a: u32,\n    b: u32,\n    c: u32,\n    d: u32,\n    e: u32,\n) {\n"
        assert found(sig + "    // Long: one flat sequence.\n" + body + "\n}\n") == []
        deep = body.replace("let x50 = 50;", "// Long: too deep to count.")
        assert found(planted.replace(body, deep)) == [("planted", LIMIT + 3)]
    print("long-functions self-test: planted long functions are found; tests and explained ones pass")


def main(argv):
    if argv == ["--self-test"]:
        self_test()
        return 0
    found = check(argv)
    for path, line, name, n in found:
        print("%s:%d: fn %s is %d lines: split it into named steps, or say why not (// Long: ...)" % (path, line, name, n))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
