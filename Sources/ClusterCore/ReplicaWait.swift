/// How long an owner may wait for its replicas before answering a call another node made
/// (ARCHITECTURE.md, "Replication"): up to the replication wait, and never past the caller's
/// deadline less the time the answer takes back. A wait that outlasts the caller's attempt turns
/// a change the owner made into a timeout there, and an UNAVAILABLE for the client after its
/// retries, although the change was made.
public enum ReplicaWait {
    /// What is left of a caller's attempt ending at `deadline` once `margin` is kept for the
    /// answer to travel back; 0 when that is already past (or when `now + margin` is past the
    /// end of the clock).
    public static func left(until deadline: UInt64, margin: UInt64, now: UInt64) -> UInt64 {
        let (answerBy, overflow) = now.addingReportingOverflow(margin)
        guard !overflow, deadline > answerBy else { return 0 }
        return deadline - answerBy
    }
}
