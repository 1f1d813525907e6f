"""A stock grpcio client against presenced over h2c: health, errors, limits, streams, shutdown."""
import os
import subprocess
import threading
import time

import grpc
import pytest

from conftest import Node, presenced_binary

import health_pb2
import health_pb2_grpc
import presence_pb2
import presence_pb2_grpc


def test_health_check_serving(node):
    stub = health_pb2_grpc.HealthStub(node.channel)
    assert stub.Check(health_pb2.HealthCheckRequest(), timeout=5).status == health_pb2.HealthCheckResponse.SERVING
    named = stub.Check(health_pb2.HealthCheckRequest(service="presence.v1.Presence"), timeout=5)
    assert named.status == health_pb2.HealthCheckResponse.SERVING


def test_health_check_unknown_service_is_not_found(node):
    stub = health_pb2_grpc.HealthStub(node.channel)
    with pytest.raises(grpc.RpcError) as e:
        stub.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=5)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    assert e.value.details().startswith("SERVICE_UNKNOWN")


def test_health_watch_streams_current_status(node):
    stub = health_pb2_grpc.HealthStub(node.channel)
    stream = stub.Watch(health_pb2.HealthCheckRequest(), timeout=5)
    first = next(stream)
    assert first.status == health_pb2.HealthCheckResponse.SERVING
    stream.cancel()


def test_unknown_method_is_unimplemented(node):
    rpc = node.channel.unary_unary("/presence.v1.Presence/NoSuchMethod",
                                   request_serializer=lambda b: b, response_deserializer=lambda b: b)
    with pytest.raises(grpc.RpcError) as e:
        rpc(b"", timeout=5)
    assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_deadline_exceeded_on_a_stream(node):
    stub = health_pb2_grpc.HealthStub(node.channel)
    with pytest.raises(grpc.RpcError) as e:
        for _ in stub.Watch(health_pb2.HealthCheckRequest(), timeout=0.3):
            pass
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


def test_oversized_message_is_resource_exhausted(node):
    stub = health_pb2_grpc.HealthStub(node.channel)
    with pytest.raises(grpc.RpcError) as e:
        stub.Check(health_pb2.HealthCheckRequest(service="x" * (4 * 1024 * 1024 + 10)), timeout=10)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    # the connection is still good
    assert stub.Check(health_pb2.HealthCheckRequest(), timeout=5).status == health_pb2.HealthCheckResponse.SERVING


def test_compressed_message_is_unimplemented(node):
    channel = grpc.insecure_channel(node.address, compression=grpc.Compression.Gzip)
    stub = health_pb2_grpc.HealthStub(channel)
    with pytest.raises(grpc.RpcError) as e:
        stub.Check(health_pb2.HealthCheckRequest(service="y" * 1000), timeout=5)
    assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
    channel.close()


def test_a_unary_call_takes_exactly_one_request_message(node):
    """A unary method called with two request messages, or none, is refused (the node keeps only
    the first message of a call and counts the rest); the connection serves on."""
    rpc = node.channel.stream_unary("/grpc.health.v1.Health/Check",
                                    request_serializer=lambda b: b, response_deserializer=lambda b: b)
    for messages, what in (([b"", b""], "2 request messages"), ([b"", b"", b""], "3 request messages"), ([], "no request message")):
        with pytest.raises(grpc.RpcError) as e:
            rpc(iter(messages), timeout=5)
        assert e.value.code() == grpc.StatusCode.INTERNAL, what
        assert e.value.details().startswith("BAD_REQUEST_STREAM") and what in e.value.details(), e.value.details()
    stub = health_pb2_grpc.HealthStub(node.channel)
    assert stub.Check(health_pb2.HealthCheckRequest(), timeout=5).status == health_pb2.HealthCheckResponse.SERVING


def test_malformed_request_is_invalid_argument(node):
    rpc = node.channel.unary_unary("/grpc.health.v1.Health/Check",
                                   request_serializer=lambda b: b, response_deserializer=lambda b: b)
    with pytest.raises(grpc.RpcError) as e:
        rpc(b"\x0a\x7f\x41", timeout=5)  # a string field claiming 127 bytes, holding 1
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_many_concurrent_calls_on_one_channel(node):
    stub = health_pb2_grpc.HealthStub(node.channel)
    futures = [stub.Check.future(health_pb2.HealthCheckRequest(), timeout=10) for _ in range(500)]
    assert all(f.result().status == health_pb2.HealthCheckResponse.SERVING for f in futures)


def test_sigterm_finishes_and_exits_cleanly():
    n = Node()
    stub = health_pb2_grpc.HealthStub(n.channel)
    stream = stub.Watch(health_pb2.HealthCheckRequest(), timeout=15)
    assert next(stream).status == health_pb2.HealthCheckResponse.SERVING
    n.proc.send_signal(15)
    # watchers see NOT_SERVING, then the stream ends (UNAVAILABLE at the end of the grace period)
    statuses = []
    try:
        for r in stream:
            statuses.append(r.status)
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.UNAVAILABLE, e
    assert health_pb2.HealthCheckResponse.NOT_SERVING in statuses
    assert n.proc.wait(timeout=15) == 0
    assert "shutting down" in n.output()


def _tunables_of(pid):
    """GLIBC_TUNABLES as the process was started with it. ld.so cuts the value in pieces in place (a NUL
    after each setting it reads), so the pieces after it that are settings belong to it."""
    with open(f"/proc/{pid}/environ", "rb") as f:
        entries = f.read().decode(errors="replace").split("\0")
    start = next((i for i, e in enumerate(entries) if e.startswith("GLIBC_TUNABLES=")), None)
    if start is None:
        return ""
    pieces = [entries[start].split("=", 1)[1]]
    for e in entries[start + 1:]:
        if not e.startswith("glibc."):
            break
        pieces.append(e)
    return ":".join(pieces)


@pytest.mark.parametrize("given,expected", [
    (None, "glibc.malloc.tcache_count=64"),
    ("glibc.malloc.arena_max=2", "glibc.malloc.arena_max=2:glibc.malloc.tcache_count=64"),
    ("glibc.malloc.tcache_count=7", "glibc.malloc.tcache_count=7"),  # the operator's opt-out stands
])
def test_the_node_reexecutes_itself_once_with_a_deeper_malloc_cache(given, expected):
    n = Node(env={"GLIBC_TUNABLES": given} if given else None)
    try:
        # the process the supervisor started is the one serving (exec keeps the pid), with the tunable
        assert _tunables_of(n.proc.pid) == expected
        assert os.path.realpath(f"/proc/{n.proc.pid}/exe") == os.path.realpath(presenced_binary())
        with open(f"/proc/{n.proc.pid}/comm") as f:  # ps and pgrep still see presenced, not "exe"
            assert f.read().strip() == os.path.basename(os.path.realpath(presenced_binary()))[:15]
        stub = health_pb2_grpc.HealthStub(n.channel)
        assert stub.Check(health_pb2.HealthCheckRequest(), timeout=10).status == health_pb2.HealthCheckResponse.SERVING
    finally:
        n.finish()


def test_start_line_names_node_and_addresses():
    n = Node()
    out = n.output()
    n.finish()
    line = next(l for l in out.splitlines() if "presenced started" in l)
    assert "node_id=interop-1" in line and f"listen=127.0.0.1:{n.port}" in line and f"peer_listen=127.0.0.1:{n.peer_port}" in line
    assert "OPEN MODE" in out


@pytest.mark.parametrize("args,needle", [
    (["--listen", "nowhere"], "--listen"),
    (["--presence-timeout", "-3"], "--presence-timeout"),
    (["--max-instant-events", "many"], "--max-instant-events"),
    (["--bogus"], "--bogus"),
    (["--log-format", "xml"], "--log-format"),
    (["--auth-secret-file", "/no/such/file"], "--auth-secret-file"),
])
def test_bad_flags_exit_nonzero_naming_the_flag(args, needle):
    r = subprocess.run([presenced_binary(), *args], capture_output=True, text=True, timeout=20)
    assert r.returncode != 0
    assert needle in r.stderr


def test_env_var_is_read_and_named_in_errors():
    r = subprocess.run([presenced_binary()], capture_output=True, text=True, timeout=20,
                       env={"PRESENCED_LISTEN": "bad"})
    assert r.returncode != 0 and "--listen" in r.stderr


def test_help_lists_every_flag():
    r = subprocess.run([presenced_binary(), "--help"], capture_output=True, text=True, timeout=20)
    assert r.returncode == 0
    for flag in ["--node-id", "--listen", "--peer-listen", "--http-listen", "--seeds", "--presence-timeout", "--max-instant-events",
                 "--presence-interval", "--replication-factor", "--auth-secret-file", "--cluster-secret-file",
                 "--log-level", "--log-format", "PRESENCED_LISTEN"]:
        assert flag in r.stdout


def test_sigterm_exits_after_sessions_came_and_went():
    import presence_pb2 as pp
    import presence_pb2_grpc as ppg
    n = Node()
    stub = ppg.PresenceStub(n.channel)
    streams = []
    for i in range(20):
        s = stub.OpenSession(pp.OpenSessionRequest(user_id=f"u{i}"))
        sid = next(s).opened.session_id
        stub.Join(pp.JoinRequest(session_id=sid, channel_name="c", channel_type=pp.CHANNEL_TYPE_MESSAGE), timeout=5)
        streams.append(s)
    for s in streams[:10]:
        s.cancel()
    assert n.stop(sig=15, timeout=15) == 0
    assert "stopped" in n.output()
