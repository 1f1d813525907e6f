"""A stock grpcio client against presenced over h2c: health, errors, limits, streams, shutdown."""
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
