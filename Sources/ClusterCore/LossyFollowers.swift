/// Nodes whose pushes from this one were lost (shed, given up, dropped with a gone process's
/// queue): the sessions following this node's channels there may have missed events, and get fresh
/// SNAPSHOTs — but only once the node can be reached again. Pushes to a node believed dead are
/// dropped at once: restarting its followers before then would lose the SNAPSHOTs again, in a
/// loop as fast as the node can build them. A plain value: losses, rings and reachability in,
/// the nodes due a restart out.
public struct LossyFollowers: Sendable, Equatable {
    private var nodes: Set<String> = []

    public init() {}

    public mutating func lost(_ node: String) { nodes.insert(node) }

    public func contains(_ node: String) -> Bool { nodes.contains(node) }

    /// The nodes whose followers get fresh SNAPSHOTs now (taken off the list): on `ring`, and
    /// reachable. A node off the ring has no followers of this node's channels left (a new
    /// process of it starts with none); it is forgotten.
    public mutating func due(ring: HashRing, reachable: (String) -> Bool) -> [String] {
        nodes = nodes.filter { ring.members.contains($0) }
        let now = nodes.filter(reachable)
        nodes.subtract(now)
        return now.sorted()
    }
}
