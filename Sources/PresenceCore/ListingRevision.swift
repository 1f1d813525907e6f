import Synchronization

/// Process-wide source of `ChannelMachine.listingRevision` values: each is taken once, so a
/// revision names one content of one machine even across copies of it that went separate ways.
enum ListingRevision {
    private static let counter = Atomic<UInt64>(0)

    static func next() -> UInt64 {
        counter.wrappingAdd(1, ordering: .relaxed).newValue
    }
}
