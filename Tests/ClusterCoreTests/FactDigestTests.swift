import ClusterCore
import Testing

/// The digests anti-entropy compares (RELIABILITY.md, "Anti-entropy"): a bucket differs when its
/// facts differ, in number or in content, and only then.
@Suite struct FactDigestTests {
    @Test func bucketsDifferWhenTheirFactsDifferInNumberOrContent() {
        let key: UInt64 = 0x1234_5678_9abc_def0
        var a = FactDigest(), b = FactDigest()
        a.add(keyHash: key, fact: 7)
        b.add(keyHash: key, fact: 7)
        #expect(a.mismatches(b).isEmpty)
        // the same number of facts, one of them another (a later version, another epoch)
        var c = FactDigest()
        c.add(keyHash: key, fact: 8)
        #expect(a.mismatches(c) == [FactDigest.bucket(key)])
        // a fact more
        b.add(keyHash: key, fact: 9)
        #expect(a.mismatches(b) == [FactDigest.bucket(key)])
        // facts of another bucket leave this one alone
        var d = a
        d.add(keyHash: ~key, fact: 1)
        #expect(a.mismatches(d) == [FactDigest.bucket(~key)])
    }

    @Test func theOrderFactsAreAddedInDoesNotMatter() {
        var a = FactDigest(), b = FactDigest()
        let facts: [(UInt64, UInt64)] = [(1 << 60, 1), (2 << 58, 2), (3, 3), (1 << 60, 4)]
        for (k, f) in facts { a.add(keyHash: k, fact: f) }
        for (k, f) in facts.reversed() { b.add(keyHash: k, fact: f) }
        #expect(a == b)
    }
}
