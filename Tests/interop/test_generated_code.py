"""The committed protoc-c and Swift output must match what Scripts/generate-protos makes now."""
import filecmp
import os
import subprocess
import tempfile

from conftest import ROOT


def test_generated_files_are_fresh():
    out = tempfile.mkdtemp(prefix="presenced-gen-")
    subprocess.run([os.path.join(ROOT, "Scripts", "generate-protos"), out], check=True, timeout=300)
    subprocess.run([os.path.join(ROOT, "Scripts", "generate-web"), out], check=True, timeout=60)
    stale = []
    for sub in ("Sources/CPresenceProto", "Sources/PresenceWire/Generated", "Sources/PresenceNode/Web"):
        fresh_dir = os.path.join(out, sub)
        for dirpath, _, files in os.walk(fresh_dir):
            for f in files:
                fresh = os.path.join(dirpath, f)
                committed = os.path.join(ROOT, os.path.relpath(fresh, out))
                if not os.path.exists(committed) or not filecmp.cmp(fresh, committed, shallow=False):
                    stale.append(os.path.relpath(committed, ROOT))
    assert not stale, "stale generated files (run Scripts/generate-protos): " + ", ".join(stale)
