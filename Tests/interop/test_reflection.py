"""gRPC server reflection on the client port: a stock grpcio-reflection client (v1alpha) discovers the
Presence service and calls a method it found, with no .proto file; the v1 service answers the same
questions; unknown names get NOT_FOUND in the stream, not a broken call."""
import grpc
from google.protobuf import descriptor_pool, message_factory
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

import reflection_pb2 as r
import reflection_pb2_grpc as rg


def test_a_client_with_no_proto_files_discovers_and_calls_a_method(node):
    db = ProtoReflectionDescriptorDatabase(node.channel)
    services = set(db.get_services())
    assert {"presence.v1.Presence", "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection",
            "grpc.reflection.v1alpha.ServerReflection"} <= services
    assert "presence.cluster.v1.Peer" not in services   # the peer port's, not served here
    pool = descriptor_pool.DescriptorPool(db)
    service = pool.FindServiceByName("presence.v1.Presence")
    method = service.methods_by_name["GetUserStatuses"]
    request_class = message_factory.GetMessageClass(method.input_type)
    response_class = message_factory.GetMessageClass(method.output_type)
    call = node.channel.unary_unary(f"/{service.full_name}/{method.name}",
                                    request_serializer=request_class.SerializeToString,
                                    response_deserializer=response_class.FromString)
    # a field found by name in the discovered descriptor
    assert "user_ids" in method.input_type.fields_by_name
    response = call(request_class(user_ids=["ann", "bob"]), timeout=5)
    assert [e.user_id for e in response.statuses] == ["ann", "bob"]
    # every method of the service was described, with its streaming shape
    assert set(service.methods_by_name) >= {"OpenSession", "Join", "SetState", "GetOnlineUsers", "Watch"}
    assert service.methods_by_name["OpenSession"].server_streaming


def test_v1_answers_several_questions_on_one_stream(node):
    stub = rg.ServerReflectionStub(node.channel)
    questions = [r.ServerReflectionRequest(list_services=""),
                 r.ServerReflectionRequest(file_containing_symbol="presence.v1.JoinRequest"),
                 r.ServerReflectionRequest(file_by_filename="no/such.proto"),
                 r.ServerReflectionRequest(file_containing_symbol="presence.v1.Presence.SetState")]
    answers = list(stub.ServerReflectionInfo(iter(questions), timeout=10))
    assert len(answers) == 4
    assert "presence.v1.Presence" in {s.name for s in answers[0].list_services_response.service}
    files = answers[1].file_descriptor_response.file_descriptor_proto
    from google.protobuf import descriptor_pb2
    first = descriptor_pb2.FileDescriptorProto.FromString(files[0])
    assert first.name == "presence.proto"
    assert "google/protobuf/wrappers.proto" in {descriptor_pb2.FileDescriptorProto.FromString(f).name for f in files[1:]}
    assert answers[2].error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0]
    assert answers[3].original_request.file_containing_symbol == "presence.v1.Presence.SetState"
    assert descriptor_pb2.FileDescriptorProto.FromString(answers[3].file_descriptor_response.file_descriptor_proto[0]).name == "presence.proto"
