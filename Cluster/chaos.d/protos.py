"""Python stubs for Protos/*.proto, generated at start-up into a temporary folder (as the interop
suite does) so they always match the checkout."""
import os
import shutil
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def load():
    """Generates the stubs and returns a namespace with the modules p, pg, a, ag, h, hg."""
    from grpc_tools import protoc
    import grpc_tools

    gen = tempfile.mkdtemp(prefix="presenced-chaos-pygen-")
    well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    for proto in ("presence.proto", "health.proto", "cluster.proto", "admin.proto"):
        rc = protoc.main(["protoc", f"-I{os.path.join(ROOT, 'Protos')}", f"-I{well_known}",
                          f"--python_out={gen}", f"--grpc_python_out={gen}", proto])
        if rc != 0:
            raise SystemExit(f"chaos: protoc failed for {proto}")
    sys.path.insert(0, gen)
    import presence_pb2, presence_pb2_grpc, admin_pb2, admin_pb2_grpc, health_pb2, health_pb2_grpc

    class NS:
        p, pg = presence_pb2, presence_pb2_grpc
        a, ag = admin_pb2, admin_pb2_grpc
        h, hg = health_pb2, health_pb2_grpc
        folder = gen

    import atexit
    atexit.register(shutil.rmtree, gen, True)
    return NS
