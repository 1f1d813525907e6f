// libFuzzer target: the protobuf bridge (PresenceWire over protobuf-c). The first input byte picks
// one of every message type of every proto; the rest is decoded as that message. A message that
// decodes must encode, and its encoding must decode to the same value. Built by Scripts/fuzz.
import PresenceWire

func roundTrip<M: ProtoMessage>(_ type: M.Type, _ bytes: UnsafeRawBufferPointer) {
    guard let m = try? M(serializedBytes: bytes) else { return }
    let again = m.serializedBytes()
    let back = again.withUnsafeBytes { try? M(serializedBytes: $0) }
    precondition(back == m, "\(M.self): a decoded message does not survive encode + decode")
}

let decoders: [(UnsafeRawBufferPointer) -> Void] = [
    { roundTrip(AdminMembersRequest.self, $0) },
    { roundTrip(AdminMember.self, $0) },
    { roundTrip(AdminMembersResponse.self, $0) },
    { roundTrip(AdminRingRequest.self, $0) },
    { roundTrip(AdminRingResponse.self, $0) },
    { roundTrip(ClusterMemberUpdate.self, $0) },
    { roundTrip(ClusterPingRequest.self, $0) },
    { roundTrip(ClusterPingResponse.self, $0) },
    { roundTrip(ClusterIndirectPingRequest.self, $0) },
    { roundTrip(ClusterJoinRequest.self, $0) },
    { roundTrip(ClusterJoinResponse.self, $0) },
    { roundTrip(ClusterSessionRef.self, $0) },
    { roundTrip(ClusterCallError.self, $0) },
    { roundTrip(ClusterChannelCall.self, $0) },
    { roundTrip(ClusterChannelResult.self, $0) },
    { roundTrip(ClusterSessionChannel.self, $0) },
    { roundTrip(ClusterHomeSession.self, $0) },
    { roundTrip(ClusterHomeCall.self, $0) },
    { roundTrip(ClusterHomeResult.self, $0) },
    { roundTrip(ClusterMemberRecord.self, $0) },
    { roundTrip(ClusterDeparture.self, $0) },
    { roundTrip(ClusterChannelRecord.self, $0) },
    { roundTrip(ClusterGoneGateway.self, $0) },
    { roundTrip(ClusterUserRecord.self, $0) },
    { roundTrip(ClusterDelivery.self, $0) },
    { roundTrip(ClusterSessionMoved.self, $0) },
    { roundTrip(ClusterPushBatch.self, $0) },
    { roundTrip(ClusterPushAck.self, $0) },
    { roundTrip(ClusterDigestRequest.self, $0) },
    { roundTrip(ClusterDigestResponse.self, $0) },
    { roundTrip(ClusterChannelFact.self, $0) },
    { roundTrip(ClusterHomeFact.self, $0) },
    { roundTrip(ClusterExchangeRequest.self, $0) },
    { roundTrip(ClusterKeySession.self, $0) },
    { roundTrip(ClusterStateCorrection.self, $0) },
    { roundTrip(ClusterExchangeResponse.self, $0) },
    { roundTrip(ClusterConfirmRequest.self, $0) },
    { roundTrip(ClusterConfirmResponse.self, $0) },
    { roundTrip(HealthCheckRequest.self, $0) },
    { roundTrip(HealthCheckResponse.self, $0) },
    { roundTrip(StateItem.self, $0) },
    { roundTrip(UserState.self, $0) },
    { roundTrip(ChannelInfo.self, $0) },
    { roundTrip(OpenSessionRequest.self, $0) },
    { roundTrip(SessionOpened.self, $0) },
    { roundTrip(IntervalInfo.self, $0) },
    { roundTrip(PresenceEvent.self, $0) },
    { roundTrip(UserStatusEvent.self, $0) },
    { roundTrip(SessionEvent.self, $0) },
    { roundTrip(CloseSessionRequest.self, $0) },
    { roundTrip(CloseSessionResponse.self, $0) },
    { roundTrip(JoinRequest.self, $0) },
    { roundTrip(JoinResponse.self, $0) },
    { roundTrip(LeaveRequest.self, $0) },
    { roundTrip(LeaveResponse.self, $0) },
    { roundTrip(GetOnlineUsersRequest.self, $0) },
    { roundTrip(GetOnlineUsersResponse.self, $0) },
    { roundTrip(GetUserChannelsRequest.self, $0) },
    { roundTrip(GetUserChannelsResponse.self, $0) },
    { roundTrip(SetStateRequest.self, $0) },
    { roundTrip(SetStateResponse.self, $0) },
    { roundTrip(GetStateRequest.self, $0) },
    { roundTrip(GetStateResponse.self, $0) },
    { roundTrip(RemoveStateRequest.self, $0) },
    { roundTrip(RemoveStateResponse.self, $0) },
    { roundTrip(SetStatusRequest.self, $0) },
    { roundTrip(SetStatusResponse.self, $0) },
    { roundTrip(UserStatusEntry.self, $0) },
    { roundTrip(GetUserStatusesRequest.self, $0) },
    { roundTrip(GetUserStatusesResponse.self, $0) },
    { roundTrip(WatchRequest.self, $0) },
    { roundTrip(WatchResponse.self, $0) },
]

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzWire(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    guard size > 0 else { return 0 }
    let pick = Int(data[0]) % decoders.count
    decoders[pick](UnsafeRawBufferPointer(start: data + 1, count: size - 1))
    return 0
}
