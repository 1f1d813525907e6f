@testable import PresenceCore
import Testing

/// A key whose hash is chosen by the test: many keys in one home slot make the long probe runs
/// that removal must keep reachable.
private struct Crowded: Hashable {
    let id: Int
    let home: Int
    func hash(into h: inout Hasher) { h.combine(home) }
    static func == (a: Crowded, b: Crowded) -> Bool { a.id == b.id }
}

@Suite struct DenseDictionaryTests {
    @Test func itStoresReplacesAndRemoves() {
        var d: DenseDictionary<String, Int> = [:]
        #expect(d.isEmpty && d["ann"] == nil && d.removeValue(forKey: "ann") == nil)
        d["ann"] = 1
        d["bob"] = 2
        d["ann"] = 3
        #expect(d.count == 2 && d["ann"] == 3 && d["bob"] == 2)
        #expect(d.modify("bob") { $0 += 10; return $0 } == 12)
        #expect(d.modify("cat") { $0 += 1 } == nil)
        #expect(d.removeValue(forKey: "ann") == 3)
        #expect(d.count == 1 && d["ann"] == nil && d["bob"] == 12)
        d["bob"] = nil
        #expect(d.isEmpty)
        d["x", default: 5] += 1
        #expect(d["x"] == 6)
        #expect(d == ["x": 6] && d != ["x": 7] && d != ["y": 6])
    }

    /// Random inserts, overwrites and removals, checked against `Dictionary` after every step:
    /// the same entries, each found, with keys crowded into few home slots so that runs are long
    /// and removals move entries back.
    @Test(arguments: [1, 3, 64]) func itAgreesWithADictionaryUnderRandomChanges(homes: Int) {
        var rng = SplitMix64(seed: UInt64(homes))
        var dense = DenseDictionary<Crowded, Int>()
        var model: [Crowded: Int] = [:]
        for step in 0..<3_000 {
            // grow to a few hundred entries, then shrink to nothing (the table gives storage back)
            let phase = step < 1_500 ? 70 : 25
            let id = Int.random(in: 0..<400, using: &rng)
            let k = Crowded(id: id, home: id % homes)
            if Int.random(in: 0..<100, using: &rng) < phase {
                dense[k] = step
                model[k] = step
            } else {
                #expect(dense.removeValue(forKey: k) == model.removeValue(forKey: k))
            }
            #expect(dense.count == model.count)
            if step % 97 == 0 || dense.count < 5 {
                for (mk, mv) in model { #expect(dense[mk] == mv) }
                #expect(Dictionary(uniqueKeysWithValues: dense.map { ($0.key, $0.value) }) == model)
            }
        }
        for k in model.keys { dense[k] = nil }
        #expect(dense.isEmpty && dense.slots.isEmpty)
    }

    /// `updateEach` visits every entry once, changes it where it lies, and leaves every key
    /// findable (past the scanning limit too, with a table of slots).
    @Test(arguments: [3, 40]) func updateEachChangesEveryValueInPlace(n: Int) {
        var d: DenseDictionary<Int, Int> = [:]
        for i in 0..<n { d[i] = i }
        var seen: [Int] = []
        d.updateEach { k, v in
            seen.append(k)
            v = v * 10 + 1
        }
        #expect(seen.sorted() == Array(0..<n))
        for i in 0..<n { #expect(d[i] == i * 10 + 1) }
        #expect(d.count == n)
    }

    @Test func aTableThatEmptiedGivesItsStorageBack() {
        var d = DenseDictionary<Int, Int>()
        for i in 0..<10_000 { d[i] = i }
        #expect(d.slots.count >= 20_000)
        for i in 0..<9_990 { d[i] = nil }
        #expect(d.count == 10 && d.slots.count <= 64 && d.entries.capacity < 1_000)
        for i in 9_990..<10_000 { #expect(d[i] == i) }
    }

    /// Scanned while small (no table of slots to allocate), hashed past that, at most half full.
    @Test func itStaysAtMostHalfFull() {
        var d = DenseDictionary<Int, Int>()
        for i in 0..<1_000 {
            d[i] = i
            if d.count <= 8 {
                #expect(d.slots.isEmpty)
            } else {
                #expect(d.slots.count >= 2 * d.count)
                #expect(d.slots.count & (d.slots.count - 1) == 0)
            }
        }
        for i in 0..<996 { d[i] = nil }
        #expect(d.slots.isEmpty && d.count == 4)
        for i in 996..<1_000 { #expect(d[i] == i) }
    }

    /// Slots take two bytes each up to 65,536 of them and four past that; every key stays
    /// findable as the table widens (32,769 entries need 131,072 slots) and narrows again.
    @Test func slotsWidenPastSixtyFiveThousandAndNarrowBack() {
        var d = DenseDictionary<Int, Int>()
        for i in 0..<100 { d[i] = i }
        #expect(d.slots.count == 256 && d.slots.byteCount == 512 && !d.slots.isWide)
        for i in 100..<32_768 { d[i] = i }
        #expect(d.slots.count == 65_536 && d.slots.byteCount == 131_072 && !d.slots.isWide)
        d[32_768] = 32_768
        #expect(d.slots.count == 131_072 && d.slots.byteCount == 524_288 && d.slots.isWide)
        for i in 32_769..<70_000 { d[i] = i }
        for i in stride(from: 0, to: 70_000, by: 7) { #expect(d[i] == i) }
        // removals while the table stays wide: entries numbered past 65,535 move into the holes
        for i in 0..<10_000 { #expect(d.removeValue(forKey: i) == i) }
        #expect(d.slots.isWide && d.count == 60_000)
        for i in stride(from: 10_000, to: 70_000, by: 3) { #expect(d[i] == i) }
        for i in stride(from: 0, to: 10_000, by: 97) { #expect(d[i] == nil) }
        // removals move the last entry into the hole: its slot, a number past 65,535, is rewritten
        for i in 10_000..<69_000 { #expect(d.removeValue(forKey: i) == i) }
        #expect(d.count == 1_000 && !d.slots.isWide && d.slots.count <= 8_192)
        for i in 69_000..<70_000 { #expect(d[i] == i) }
        for i in 0..<69_000 where i % 1_000 == 0 { #expect(d[i] == nil) }
    }
}

