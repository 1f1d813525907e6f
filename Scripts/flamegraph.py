#!/usr/bin/env python3
"""Folds `perf script` output into stacks, draws them as a flame graph (SVG), and says where the
time goes: by category (kernel, Swift runtime, malloc, nghttp2, Swift concurrency, protobuf-c,
presenced's own code, other) and by function (self time).

  perf script -i perf.data | Scripts/flamegraph.py --title "SetState" --svg out.svg --folded out.folded

Swift symbols are demangled with `swift demangle --simplified --compact`. Standard library only.
"""
import argparse
import collections
import html
import re
import shutil
import subprocess
import sys

FRAME = re.compile(r"^\s*[0-9a-f]+\s+(.*?)\s+\((.*)\)\s*$")


def parse(lines):
    """Yields (comm, [(symbol, dso), ...] leaf first) per sample."""
    comm, frames = None, []
    for line in lines:
        if not line.strip():
            if comm is not None and frames:
                yield comm, frames
            comm, frames = None, []
            continue
        if comm is None and not line.startswith((" ", "\t")):
            comm = line.split()[0]
            continue
        m = FRAME.match(line)
        if m:
            sym = re.sub(r"\+0x[0-9a-f]+$", "", m.group(1))
            frames.append((sym, m.group(2).rsplit("/", 1)[-1]))
    if comm is not None and frames:
        yield comm, frames


def demangle(symbols):
    tool = shutil.which("swift-demangle") or shutil.which("swift")
    mangled = sorted(s for s in symbols if s.startswith(("$s", "_$s", "$S")))
    if not tool or not mangled:
        return {}
    cmd = [tool, "--simplified", "--compact"] if tool.endswith("swift-demangle") else [tool, "demangle", "--simplified", "--compact"]
    out = subprocess.run(cmd, input="\n".join(mangled), capture_output=True, text=True).stdout.splitlines()
    return dict(zip(mangled, out)) if len(out) == len(mangled) else {}


def category(sym, dso):
    s = sym
    if "kernel" in dso or dso.startswith("[k"):
        return "kernel"
    if "nghttp2" in dso:
        return "nghttp2"
    if "protobuf-c" in dso:
        return "protobuf-c"
    if dso.startswith("libc.so") or dso.startswith("libc-"):
        if re.search(r"malloc|free|cfree|realloc|calloc|_int_|arena|tcache", s):
            return "malloc/free"
        return "libc (syscalls, memcpy, locks)"
    if "libswift_Concurrency" in dso or "libdispatch" in dso:
        return "Swift concurrency"
    if "libswiftCore" in dso or "libswiftSynchronization" in dso or "libFoundation" in dso:
        if re.search(r"retain|release|swift_bridgeObject", s):
            return "Swift runtime: retain/release"
        if re.search(r"exclusivity|beginAccess|endAccess", s):
            return "Swift runtime: exclusivity"
        if re.search(r"[Mm]etadata|conformance|getGeneric|swift_dynamicCast", s):
            return "Swift runtime: metadata/casts"
        if re.search(r"swift_allocObject|swift_deallocObject|swift_slowAlloc|swift_slowDealloc", s):
            return "malloc/free"
        return "Swift standard library"
    if re.search(r"swift_task|swift_job|swift_continuation|swift_asyncLet", s):
        return "Swift concurrency"
    if dso in ("presenced", "presence-bench", "presencectl"):
        return "presenced's own code"
    return "other: " + dso


def flame_svg(folded, title, width=1600, row=16):
    """A flame graph (root at the bottom) of {stack tuple: samples}."""
    root = {"n": 0, "kids": collections.OrderedDict()}
    for stack, n in sorted(folded.items()):
        node = root
        node["n"] += n
        for f in stack:
            node = node["kids"].setdefault(f, {"n": 0, "kids": collections.OrderedDict()})
            node["n"] += n
    total = root["n"] or 1
    depth = [0]

    def measure(node, d):
        depth[0] = max(depth[0], d)
        for k in node["kids"].values():
            measure(k, d + 1)
    measure(root, 0)
    height = (depth[0] + 3) * row
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="monospace" font-size="11">',
           f'<rect width="100%" height="100%" fill="#fdfdf6"/><text x="8" y="14" font-size="13">{html.escape(title)} ({total} samples)</text>']

    def color(name):
        h = sum(ord(c) for c in name) % 60
        return f"hsl({10 + h},85%,{58 + h % 12}%)"

    def draw(node, x, d):
        for name, k in node["kids"].items():
            w = k["n"] / total * (width - 16)
            if w >= 0.3:
                y = height - (d + 2) * row
                pct = 100.0 * k["n"] / total
                label = html.escape(name)
                out.append(f'<g><title>{label} ({k["n"]} samples, {pct:.2f}%)</title>'
                           f'<rect x="{8 + x:.1f}" y="{y}" width="{w:.1f}" height="{row - 1}" fill="{color(name)}"/>')
                chars = int(w / 7)
                if chars >= 3:
                    text = name if len(name) <= chars else name[: chars - 2] + ".."
                    out.append(f'<text x="{10 + x:.1f}" y="{y + row - 4}">{html.escape(text)}</text>')
                out.append("</g>")
                draw(k, x, d + 1)
            x += w
    draw(root, 0, 0)
    out.append("</svg>")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--title", default="profile")
    ap.add_argument("--svg")
    ap.add_argument("--folded")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--comm", help="only samples of this command (process name)")
    a = ap.parse_args()
    samples = [(c, f) for c, f in parse(sys.stdin) if not a.comm or c.startswith(a.comm)]
    names = demangle({s for _, fr in samples for s, _ in fr})
    folded = collections.Counter()
    cats = collections.Counter()
    self_time = collections.Counter()
    for _, frames in samples:
        frames = [(names.get(s, s), d) for s, d in frames]
        folded[tuple(f"{s}" for s, _ in reversed(frames))] += 1
        leaf, dso = frames[0]
        cats[category(leaf, dso)] += 1
        self_time[f"{leaf}  [{dso}]"] += 1
    total = sum(cats.values()) or 1
    if a.folded:
        with open(a.folded, "w") as f:
            for stack, n in folded.most_common():
                f.write(";".join(s.replace(";", ",") for s in stack) + f" {n}\n")
    if a.svg:
        with open(a.svg, "w") as f:
            f.write(flame_svg(folded, a.title))
    print(f"samples: {total}")
    print("| where the time goes (self time) | share |")
    print("|---|---|")
    for c, n in cats.most_common():
        print(f"| {c} | {100.0 * n / total:.1f}% |")
    print()
    print(f"| top {a.top} functions (self time) | share |")
    print("|---|---|")
    for s, n in self_time.most_common(a.top):
        print(f"| `{s[:150]}` | {100.0 * n / total:.1f}% |")


if __name__ == "__main__":
    main()
