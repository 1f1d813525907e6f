import CSystemShim
import Testing

/// The allocator nghttp2 sessions use (`cshim_pages_*`): zeroed blocks from its pages, contents kept
/// across a reallocation, blocks zero again once freed and handed out anew.
@Suite struct PageAllocatorTests {
    @Test func callocGivesZeroesAndAFreedBlockComesBackZeroed() throws {
        // (7 pages: a size nghttp2 never asks for — its tables are powers of two, its frame buffer
        // 5 pages — so sessions of tests running meanwhile do not take the freed block first)
        let size = 7 * 4096
        let p = try #require(cshim_pages_calloc(1, size, nil))
        let bytes = p.bindMemory(to: UInt8.self, capacity: size)
        #expect((0..<size).allSatisfy { bytes[$0] == 0 })
        for i in 0..<size { bytes[i] = 0xA5 }
        cshim_pages_free(p, nil)
        // a block of the same size is the one just freed (its stack's top), zeroed by the kernel
        // (under AddressSanitizer the allocator steps aside: glibc's calloc zeroes it)
        let q = try #require(cshim_pages_calloc(size, 1, nil))
        if cshim_pages_enabled() != 0 { #expect(q == p) }
        let again = q.bindMemory(to: UInt8.self, capacity: size)
        #expect((0..<size).allSatisfy { again[$0] == 0 })
        cshim_pages_free(q, nil)
    }

    @Test func reallocKeepsTheContentsWhateverTheBlockCameFrom() throws {
        // from glibc (small), into a page block, to a bigger page block, back to a small one
        var p = try #require(cshim_pages_malloc(100, nil))
        for i in 0..<100 { p.storeBytes(of: UInt8(i), toByteOffset: i, as: UInt8.self) }
        p = try #require(cshim_pages_realloc(p, 6000, nil))
        #expect((0..<100).allSatisfy { p.load(fromByteOffset: $0, as: UInt8.self) == UInt8($0) })
        p = try #require(cshim_pages_realloc(p, 20_000, nil))
        #expect((0..<100).allSatisfy { p.load(fromByteOffset: $0, as: UInt8.self) == UInt8($0) })
        p = try #require(cshim_pages_realloc(p, 50, nil))
        #expect((0..<50).allSatisfy { p.load(fromByteOffset: $0, as: UInt8.self) == UInt8($0) })
        cshim_pages_free(p, nil)
    }

    @Test func anOverflowingCallocIsRefused() {
        #expect(cshim_pages_calloc(Int.max, 16, nil) == nil)
        cshim_pages_free(nil, nil)   // (and freeing nothing is fine)
    }
}
