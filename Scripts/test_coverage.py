"""Which Swift tests run which source line: the map `Scripts/mutate --generate` selects a mutant's
tests with (issue 37).

A mutant can only make a test fail if the test runs the mutated line, so running the tests that
run it is running the whole suite, as far as that mutant is concerned, in a fraction of the time.
The map is made from a build with coverage instrumentation (a build folder of its own), each test
run alone in its own process with its own profile; it is kept next to that build, keyed by a hash
of the sources, and made again when they change.
"""
import hashlib
import json
import os
import re
import shutil
import subprocess
import time

COVERAGE_FLAGS = ["-Xswiftc", "-profile-generate", "-Xswiftc", "-profile-coverage-mapping"]
TEST_BINARY = "presencedPackageTests.xctest"


def _toolchain_tool(name):
    """The toolchain's own llvm tools: the profiles its compiler writes are in its LLVM's format
    (Debian's llvm-profdata is older and refuses them)."""
    swift = shutil.which("swift")
    here = os.path.join(os.path.dirname(os.path.realpath(swift)), name) if swift else None
    return here if here and os.path.exists(here) else name


def sources_hash(root):
    h = hashlib.sha256()
    for rel in _swift_files(root, "Sources") + _swift_files(root, "Tests"):
        h.update(rel.encode())
        h.update(open(os.path.join(root, rel), "rb").read())
    return h.hexdigest()[:16]


def _run(cmd, cwd, log, env=None, timeout=None):
    with open(log, "ab") as out:
        out.write(("\n$ " + " ".join(cmd) + "\n").encode())
        out.flush()
        return subprocess.run(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=timeout).returncode


def _lcov_lines(text, root):
    """{relative source path: set(line)} of lines run at least once, from lcov text."""
    covered, current = {}, None
    for line in text.splitlines():
        if line.startswith("SF:"):
            path = os.path.relpath(line[3:], root)
            current = covered.setdefault(path, set()) if path.startswith("Sources/") else None
        elif current is not None and line.startswith("DA:"):
            n, _, count = line[3:].partition(",")
            if count.split(",")[0] not in ("0", ""):
                current.add(int(n))
    return covered


class CoverageMap:
    def __init__(self, tests, lines, seconds):
        self.tests = tests          # [test id]
        self.lines = lines          # {file: {line: [test index]}}
        self.seconds = seconds      # [seconds each test took alone]

    def tests_for(self, file, lines):
        """The tests that run any of these lines of file, fastest first, each with the seconds it
        took alone."""
        hit = set()
        for n in lines:
            hit.update(self.lines.get(file, {}).get(n, ()))
        return [(self.tests[k], self.seconds[k]) for k in sorted(hit, key=lambda k: self.seconds[k])]

    def save(self, path, key):
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"key": key, "tests": self.tests, "seconds": self.seconds,
                       "lines": {f_: {str(n): ks for n, ks in m.items()} for f_, m in self.lines.items()}}, f)

    @staticmethod
    def load(path, key):
        try:
            d = json.load(open(path, encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if d.get("key") != key:
            return None
        return CoverageMap(d["tests"], {f: {int(n): ks for n, ks in m.items()} for f, m in d["lines"].items()}, d["seconds"])


def build_map(scratch, log, skip=("SimulationScheduleTests",), progress=print):
    """The map for the sources in scratch: a coverage build in scratch/.build-coverage, then each
    test (but those of `skip`, which Scripts/test runs from the optimized build) alone."""
    key = sources_hash(scratch)
    build = os.path.join(scratch, ".build-coverage")
    path = os.path.join(build, "test-coverage-map.json")
    cached = CoverageMap.load(path, key)
    if cached:
        return cached
    t0 = time.monotonic()
    if _run(["swift", "build", "--build-tests", "--scratch-path", build] + COVERAGE_FLAGS, scratch, log) != 0:
        raise SystemExit(f"the coverage build failed: see {log}")
    listing = subprocess.run(["swift", "test", "--skip-build", "--scratch-path", build, "list"], cwd=scratch,
                             capture_output=True, text=True).stdout.split()
    tests = [t for t in listing if t and not any(f".{s}/" in t for s in skip)]
    binary = os.path.join(build, "debug", TEST_BINARY)
    profiles = os.path.join(build, "profiles")
    os.makedirs(profiles, exist_ok=True)
    seconds = []
    lines = {}
    sources = [os.path.join(scratch, f) for f in _swift_files(scratch, "Sources")]
    progress(f"   coverage: {len(tests)} tests, each alone")
    for k, t in enumerate(tests):
        raw = os.path.join(profiles, f"{k}.profraw")
        data = os.path.join(profiles, f"{k}.profdata")
        env = dict(os.environ, LLVM_PROFILE_FILE=raw, SWIFT_DETERMINISTIC_HASHING="1")
        s0 = time.monotonic()
        try:
            _run([binary, "--testing-library", "swift-testing", "--filter", filter_for([t])], scratch, log, env=env, timeout=600)
        except subprocess.TimeoutExpired:
            pass
        seconds.append(round(time.monotonic() - s0, 2))
        if not os.path.exists(raw):
            continue
        if _run([_toolchain_tool("llvm-profdata"), "merge", "-sparse", raw, "-o", data], scratch, log) != 0:
            raise SystemExit(f"llvm-profdata could not read a test's profile: see {log}")
        out = subprocess.run([_toolchain_tool("llvm-cov"), "export", "-format=lcov", "-skip-functions", f"-instr-profile={data}", binary] + sources,
                             cwd=scratch, capture_output=True, text=True).stdout
        for f, ns in _lcov_lines(out, scratch).items():
            m = lines.setdefault(f, {})
            for n in ns:
                m.setdefault(n, []).append(k)
        os.remove(raw)
        os.remove(data)
        if (k + 1) % 50 == 0:
            progress(f"   coverage: {k + 1} of {len(tests)} ({time.monotonic() - t0:.0f} s)")
    cmap = CoverageMap(tests, lines, seconds)
    cmap.save(path, key)
    progress(f"   coverage map made in {time.monotonic() - t0:.0f} s")
    return cmap


def filter_for(tests):
    """A `--filter` that selects exactly these tests (an id is `Module.Suite/name()`, and the
    library matches it with what follows: a `/` or the end)."""
    escaped = [re.sub(r"([\\.^$|?*+()\[\]{}])", r"\\\1", t) for t in tests]
    return "^(" + "|".join(escaped) + ")(/|$)"


def _swift_files(root, folder):
    """Every Swift file under root/folder, relative to root, in a fixed order."""
    out = []
    for d, dirs, names in os.walk(os.path.join(root, folder)):
        dirs.sort()
        out += [os.path.relpath(os.path.join(d, n), root) for n in sorted(names) if n.endswith(".swift")]
    return out
