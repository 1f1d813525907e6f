"""Mutants generated mechanically from Swift sources (issue 37): `Scripts/mutate --generate`.

A small lexer (comments and string literals are never mutated) and one function per kind of
mutation. Each mutant is one edit of one file: a byte range and its replacement. Enumeration is
deterministic (files sorted, sites in order), so a seed picks the same sample on every machine.

Kinds (the issue's list):
  relational      `<`<->`<=`, `>`<->`>=`, `==`<->`!=` (binary, spaced operators only: `<T>` is a generic)
  off-by-one      `+ 1`, `- 1`, `+= 1`, `-= 1` lose their one
  boolean         `true`<->`false`
  negate          the condition of `if`, `guard`, `while` negated (not `if let`/`case`, not lists)
  logical         `&&`<->`||`
  remove-call     a statement that only calls a function removed (not logging or assertions:
                  a log line or a precondition changes nothing a user or a test can see)
  early-return    `return;` first in a function that returns nothing
  try-optional    a statement `try f()` made `_ = try? f()`: its error swallowed
  swap-case       two neighbouring `case .a:` / `case .b:` arms of a switch exchange their patterns
"""
import hashlib
import os
import re

OP_CHARS = set("/=-+!*%<>&|^~?")
IDENT_START = re.compile(r"[A-Za-z_$`#@]")
IDENT = re.compile(r"`[^`\n]*`|[#@]?[A-Za-z_$][A-Za-z0-9_$]*")
NUMBER = re.compile(r"0[xX][0-9a-fA-F_]+|0[bB][01_]+|0[oO][0-7_]+|[0-9][0-9_]*(?:\.[0-9][0-9_]*)?(?:[eE][+-]?[0-9]+)?")

# callees whose removal no test can see by design (the log and the node's own assertions)
UNOBSERVABLE_CALLS = ("logger.", "self.logger.", "log.", "print(", "debugPrint(", "fatalError(")
UNOBSERVABLE_NAMES = re.compile(r"(?:^|\.)(?:assert|precondition|dispatchPrecondition)\w*\(")
# files whose code is not the product's: the benchmark driver (its figures are its test)
EXCLUDED_DIRS = ("Generated", "presence-bench")


class Token:
    __slots__ = ("kind", "text", "start", "end", "line", "space_before", "space_after")

    def __init__(self, kind, text, start, end, line):
        self.kind, self.text, self.start, self.end, self.line = kind, text, start, end, line
        self.space_before = self.space_after = False

    def __repr__(self):
        return f"{self.kind}:{self.text!r}@{self.line}"


def _skip_string(src, i):
    """i is at a string literal's opening (after any `#`s); returns the index past its end."""
    hashes = 0
    j = i
    while src[j] == "#":
        hashes += 1
        j += 1
    multi = src.startswith('"""', j)
    quote = '"""' if multi else '"'
    j += len(quote)
    close = quote + "#" * hashes
    escape = "\\" + "#" * hashes
    n = len(src)
    while j < n:
        if src.startswith(escape, j):
            k = j + len(escape)
            if k < n and src[k] == "(":
                # an interpolation: skip its balanced parentheses (strings inside included)
                depth, k = 1, k + 1
                while k < n and depth:
                    c = src[k]
                    if c == '"' or (c == "#" and src[k:k + 2] in ('#"', "##")):
                        k = _skip_string(src, k)
                        continue
                    depth += (c == "(") - (c == ")")
                    k += 1
                j = k
            else:
                j = k + 1
            continue
        if src.startswith(close, j):
            return j + len(close)
        if not multi and src[j] == "\n":
            return j          # (unterminated on its line: not valid Swift; stop here)
        j += 1
    return n


def tokenize(src):
    """Tokens of a Swift file (comments and string literals dropped, each string as one `string`
    token), each with whether whitespace stands before and after it."""
    toks, i, n, line = [], 0, len(src), 1
    while i < n:
        c = src[i]
        if c == "\n":
            line += 1
            i += 1
            continue
        if c in " \t\r":
            i += 1
            continue
        if src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
            continue
        if src.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if src.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif src.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            line += src.count("\n", i, j)
            i = j
            continue
        start = i
        if c == '"' or (c == "#" and re.match(r'#+"', src[i:i + 8])):
            i = _skip_string(src, i)
            toks.append(Token("string", src[start:i], start, i, line))
            line += src.count("\n", start, i)
            continue
        if c.isdigit():
            m = NUMBER.match(src, i)
            i = m.end()
            toks.append(Token("number", m.group(), start, i, line))
            continue
        if IDENT_START.match(c):
            m = IDENT.match(src, i)
            if m and m.end() > i:
                i = m.end()
                toks.append(Token("ident", m.group(), start, i, line))
                continue
        if c == ".":
            j = i + 1
            if src.startswith("..", i):
                j = i + 2
                if j < n and src[j] in ".<":
                    j += 1
                toks.append(Token("op", src[i:j], start, j, line))
            else:
                toks.append(Token("punct", ".", start, j, line))
            i = j
            continue
        if c in OP_CHARS:
            j = i
            while j < n and src[j] in OP_CHARS and not src.startswith("//", j) and not src.startswith("/*", j):
                j += 1
            toks.append(Token("op", src[i:j], start, j, line))
            i = j
            continue
        toks.append(Token("punct", c, start, i + 1, line))
        i += 1
    for t in toks:
        t.space_before = t.start == 0 or src[t.start - 1] in " \t\r\n"
        t.space_after = t.end >= n or src[t.end] in " \t\r\n"
    return toks


class Mutant:
    __slots__ = ("file", "module", "kind", "line", "lines", "edits", "before", "after", "id")

    def __init__(self, file, module, kind, line, edits, src):
        """edits: [(start, end, replacement)], non-overlapping."""
        self.file, self.module, self.kind, self.line = file, module, kind, line
        self.edits = sorted(edits)
        # every source line (1-based) an edit touches: the tests that run one of them are its tests
        self.lines = sorted({n for s, e, _ in self.edits
                             for n in range(src.count("\n", 0, s) + 1, src.count("\n", 0, e) + 2)})
        lo = src.rfind("\n", 0, self.edits[0][0]) + 1
        hi = src.find("\n", self.edits[-1][1])
        hi = len(src) if hi < 0 else hi
        self.before = src[lo:hi]
        self.after = apply_edits(src[lo:hi], [(s - lo, e - lo, r) for s, e, r in self.edits])
        self.id = None    # (set by mutants_of_file: stable while unrelated lines move)

    def apply(self, src):
        return apply_edits(src, self.edits)


def apply_edits(src, edits):
    out, pos = [], 0
    for s, e, r in sorted(edits):
        out.append(src[pos:s])
        out.append(r)
        pos = e
    out.append(src[pos:])
    return "".join(out)


SWAP = {"<": "<=", "<=": "<", ">": ">=", ">=": ">", "==": "!=", "!=": "=="}


def _binary(t):
    return t.kind == "op" and t.space_before and t.space_after


def _condition_end(toks, i, stop):
    """From toks[i] (the first token of a condition), the index of the depth-0 token `stop`
    ('{' or 'else') that ends it, or None when the condition is not a single expression."""
    depth = 0
    for k in range(i, min(len(toks), i + 400)):
        t = toks[k]
        if t.text in ("(", "["):
            depth += 1
        elif t.text in (")", "]"):
            depth -= 1
            if depth < 0:
                return None
        elif depth == 0:
            if t.text == stop:
                return k
            if t.text in (",", "let", "var", "case", "{", "}", ";") or t.text.startswith("#"):
                return None
    return None


def _statement_lines(src):
    """(start offset, text) of each line."""
    pos = 0
    for text in src.split("\n"):
        yield pos, text
        pos += len(text) + 1


CALL_STATEMENT = re.compile(r"^(?:try |await |try await )?[A-Za-z_$][\w$]*(?:\??\.[A-Za-z_$][\w$]*)*\(.*\)$")
CASE_ARM = re.compile(r"^(\s*)case \.([A-Za-z_]\w*):(.*)$")
VOID_FUNC = re.compile(r"^\s*(?:@\w+\s+)*(?:(?:public|private|fileprivate|internal|package|static|final|override|mutating|nonisolated|@MainActor|@inlinable|@discardableResult)\s+)*func [^-]*\)\s*(?:async\s*)?(?:throws(?:\([^)]*\))?\s*)?\{\s*$")


def _balanced(s):
    depth = 0
    for ch in s:
        depth += (ch in "([{") - (ch in ")]}")
        if depth < 0:
            return False
    return depth == 0


def mutants_of_file(path, rel, module):
    src = open(path, encoding="utf-8").read()
    toks = tokenize(src)
    out = []

    # lines that only log or assert: neither a user nor a test of the product can see them change
    quiet = {n for n, (_, text) in enumerate(_statement_lines(src), 1)
             if text.strip().replace("try ", "").startswith(UNOBSERVABLE_CALLS)
             or UNOBSERVABLE_NAMES.search(text.strip().split("(", 1)[0] + "(")}

    def add(kind, line, edits):
        if line not in quiet:
            out.append(Mutant(rel, module, kind, line, edits, src))

    for i, t in enumerate(toks):
        if t.kind == "op" and t.text in SWAP and _binary(t):
            add("relational", t.line, [(t.start, t.end, SWAP[t.text])])
        elif t.kind == "op" and t.text in ("&&", "||") and _binary(t):
            add("logical", t.line, [(t.start, t.end, "||" if t.text == "&&" else "&&")])
        elif t.kind == "op" and t.text in ("+", "-", "+=", "-=") and _binary(t) and i + 1 < len(toks):
            nxt = toks[i + 1]
            after = toks[i + 2] if i + 2 < len(toks) else None
            # (`x + 1 * y`: the one binds to its right; not an off-by-one of x)
            if nxt.text == "1" and not (after and after.kind == "op" and after.text in ("*", "/", "%", "<<", ">>", "&")):
                add("off-by-one", t.line, [(nxt.start, nxt.end, "0")])
        elif t.kind == "ident" and t.text in ("true", "false"):
            prev = toks[i - 1] if i else None
            if prev is not None and prev.text == ".":
                continue
            add("boolean", t.line, [(t.start, t.end, "false" if t.text == "true" else "true")])
        elif t.kind == "ident" and t.text in ("if", "guard", "while") and i + 1 < len(toks):
            prev = toks[i - 1] if i else None
            if prev is not None and prev.text == ".":
                continue
            first = toks[i + 1]
            if first.text in ("let", "var", "case") or first.text.startswith("#"):
                continue
            end = _condition_end(toks, i + 1, "else" if t.text == "guard" else "{")
            if end is None or end == i + 1:
                continue
            last = toks[end - 1]
            add("negate", t.line, [(first.start, first.start, "!("), (last.end, last.end, ")")])

    lines = list(_statement_lines(src))
    # (a line-level mutant needs code where its line starts: not the inside of a string literal,
    # such as the JavaScript the web assets carry, nor a comment)
    code_starts = {t.start for t in toks if t.kind != "string"}
    for n, (pos, text) in enumerate(lines, 1):
        body = text.strip()
        indent = len(text) - len(text.lstrip())
        if body and pos + indent not in code_starts:
            continue
        if "//" in body or '"' in body and body.count('"') % 2:
            body_code = None
        else:
            body_code = body
        if body_code and CALL_STATEMENT.match(body_code) and _balanced(body_code) \
                and not body_code.replace("try ", "").replace("await ", "").startswith(UNOBSERVABLE_CALLS) \
                and not UNOBSERVABLE_NAMES.search(body_code.split("(", 1)[0] + "(") \
                and not re.search(r"(?<![=!<>])=(?!=)", body_code.split("(", 1)[0]):
            add("remove-call", n, [(pos + indent, pos + len(text.rstrip()), "")])
        if body_code and body_code.startswith("try ") and _balanced(body_code) \
                and not re.search(r"(?<![=!<>])=(?!=)", body_code.split("(", 1)[0]):
            add("try-optional", n, [(pos + indent, pos + indent + 4, "_ = try? ")])
        if VOID_FUNC.match(text) and " init(" not in text and "->" not in text:
            end = pos + len(text.rstrip())
            add("early-return", n, [(end, end, " return;")])
    # neighbouring single-pattern arms of one switch (same indentation, nothing shallower between)
    prev = None
    for n, (pos, text) in enumerate(lines, 1):
        stripped = text.strip()
        indent = len(text) - len(text.lstrip())
        m = CASE_ARM.match(text) if pos + indent in code_starts else None
        if m:
            if prev and prev[2] == len(m.group(1)) and prev[3] != m.group(2):
                p_pos, p_n, _, p_name, p_start = prev
                s = pos + m.start(2)
                edits = [(p_start, p_start + len(p_name), m.group(2)), (s, s + len(m.group(2)), p_name)]
                add("swap-case", p_n, edits)
            prev = (pos, n, len(m.group(1)), m.group(2), pos + m.start(2))
        elif stripped and prev and indent <= prev[2] and not stripped.startswith(("case ", "default:", "@unknown")):
            prev = None
        elif stripped.startswith(("case ", "default:")) and prev and indent == prev[2]:
            prev = None
    seen = {}
    for m in out:
        key = (m.kind, m.before.strip(), m.after.strip())
        k = seen[key] = seen.get(key, -1) + 1
        digest = hashlib.sha256(f"{rel}\0{key}\0{k}".encode()).hexdigest()[:8]
        m.id = f"{os.path.basename(rel)[:-6]}:{m.kind}:{digest}"
    return out


def module_of(rel):
    parts = rel.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "Sources" else parts[0]


def all_mutants(root, only_dir=None):
    """Every mutant of every hand-written Swift file under Sources/ (or only_dir), in a fixed order."""
    base = os.path.join(root, only_dir) if only_dir else os.path.join(root, "Sources")
    files = []
    for d, dirs, names in os.walk(base):
        dirs[:] = sorted(x for x in dirs if x not in EXCLUDED_DIRS)
        files += [os.path.join(d, x) for x in names if x.endswith(".swift")]
    out = []
    for path in sorted(files):
        rel = os.path.relpath(path, root)
        out += mutants_of_file(path, rel, module_of(rel))
    return out


def sample(mutants, n, seed):
    """n mutants picked by seed (a number or a commit): the same seed, the same sample. Each
    mutant's rank is a hash of the seed and its id, so a change elsewhere in the sources leaves
    the rest of the sample as it was (a sweep run over several sittings stays one sample)."""
    ranked = sorted(mutants, key=lambda m: hashlib.sha256(f"{seed}\0{m.id}".encode()).hexdigest())
    picked = {id(m) for m in ranked[:n]}
    return [m for m in mutants if id(m) in picked]
