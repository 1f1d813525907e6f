/// Encoded pages of channel listings (GetOnlineUsers answers), each kept with the
/// `ChannelMachine.listingRevision` it was made from and served only while the channel still has
/// that revision: a channel read more often than it changes (a big room that every joining client
/// lists) encodes each page once per change instead of once per call.
///
/// Bounded in bytes: a page that would take it past `byteLimit` empties it first (pages are made
/// again on the next read; a cache that size holds the first pages of thousands of channels).
public struct ListingCache: Sendable {
    /// Which page of which channel, with or without state.
    public struct Page: Hashable, Sendable {
        public let channel: ChannelKey
        public let after: String
        public let includeState: Bool
        public init(channel: ChannelKey, after: String, includeState: Bool) {
            self.channel = channel
            self.after = after
            self.includeState = includeState
        }
    }

    private var pages: [Page: (revision: UInt64, bytes: [UInt8])] = [:]
    public private(set) var bytes = 0
    public let byteLimit: Int

    /// `byteLimit` 0 keeps nothing.
    public init(byteLimit: Int) {
        self.byteLimit = max(0, byteLimit)
    }

    public var count: Int { pages.count }

    /// The page as encoded at `revision`, if it is kept.
    public func page(_ page: Page, at revision: UInt64) -> [UInt8]? {
        guard let kept = pages[page], kept.revision == revision else { return nil }
        return kept.bytes
    }

    /// Keeps `bytes` as the page at `revision` (replacing what was kept of that page).
    public mutating func keep(_ page: Page, at revision: UInt64, bytes new: [UInt8]) {
        let cost = Self.cost(of: page, new)
        guard cost <= byteLimit else { return }
        if let old = pages.removeValue(forKey: page) { bytes -= Self.cost(of: page, old.bytes) }
        if bytes + cost > byteLimit {
            pages.removeAll(keepingCapacity: true)
            bytes = 0
        }
        pages[page] = (revision, new)
        bytes += cost
    }

    /// What a kept page counts against the limit: its bytes, its key's strings and some overhead.
    static func cost(of page: Page, _ bytes: [UInt8]) -> Int {
        bytes.count + page.after.utf8.count + page.channel.name.utf8.count + 64
    }
}
