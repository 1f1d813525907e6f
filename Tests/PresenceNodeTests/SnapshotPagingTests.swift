import GRPCTransport
@testable import PresenceNode
import PresenceCore
import PresenceWire
import Testing

/// A SNAPSHOT of a channel of any size reaches a client that accepts 4 MiB messages: past
/// `Limits.maxSnapshotPageBytes` it is sent as pages (issue 9).
@Suite struct SnapshotPagingTests {
    func fullState(_ i: Int) -> UserState {
        UserState(userID: "user-\(i)", states: (0..<Limits.maxStateKeys).map {
            StateItem(key: "key-\($0)", value: String(repeating: "v", count: Limits.maxStateValueBytes))
        })
    }

    func messages(_ framed: [UInt8]) -> [PresenceEvent] {
        var deframer = MessageDeframer(maxMessageSize: 4 << 20)
        var events: [PresenceEvent] = []
        let failure = framed.withUnsafeBufferPointer { buffer in
            deframer.append(buffer) { bytes in
                if case .presence(let e)? = (try? SessionEvent(serializedBytes: bytes))?.event { events.append(e) }
            }
        }
        #expect(failure == nil)
        return events
    }

    @Test func aSnapshotOverThePageSizeGoesOutInPagesThatTogetherListEveryUserInOrder() {
        let users = (0..<300).map(fullState)   // ~10 MiB of state
        let event = PresenceEvent(type: .snapshot, channelType: .message, channelName: "big", snapshot: users, timestampMs: 7, sequence: 42)
        let framed = EventEncoding.framed(event)
        let pages = messages(framed)
        #expect(pages.count >= 9)
        var offset = 0
        var listed: [UserState] = []
        for (i, page) in pages.enumerated() {
            let size = MessageFraming.framed(SessionEvent(event: .presence(page))).count
            #expect(size <= Limits.maxSnapshotPageBytes, "page \(i): \(size) bytes")
            #expect(page.type == .snapshot && page.sequence == 42 && page.timestampMs == 7 && page.channelName == "big")
            #expect(page.snapshotContinues == (i < pages.count - 1))
            #expect(!page.snapshot.isEmpty)
            listed += page.snapshot
            offset += size
        }
        #expect(offset == framed.count)   // nothing but the pages
        #expect(listed == users)
    }

    @Test func aSnapshotThatFitsIsOneMessageAndNeverMarkedContinuing() {
        let event = PresenceEvent(type: .snapshot, channelType: .message, channelName: "small", snapshot: (0..<20).map(fullState), sequence: 3)
        let pages = messages(EventEncoding.framed(event))
        #expect(pages.count == 1 && pages[0].snapshot.count == 20 && !pages[0].snapshotContinues)
        // other events are never split, whatever their size
        let interval = PresenceEvent(type: .interval, channelType: .message, channelName: "c",
                                     interval: IntervalInfo(userStates: (0..<40).map(fullState)), sequence: 4)
        #expect(messages(EventEncoding.framed(interval, maxPageBytes: 1024)).count == 1)
    }
}
