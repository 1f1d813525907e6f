import CNGHTTP2
import CSystemShim
import Glibc
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

    /// The block noted while a session is created is nghttp2's frame buffer: once released its pages
    /// are not resident, and the session writes its next frames through it as before.
    @Test func aSessionsFrameBufferIsNotedAndReleasedBetweenFrames() throws {
        guard cshim_pages_enabled() != 0 else { return }   // (under ASan nothing is noted: tested above)
        let notes = UnsafeMutablePointer<cshim_pages_session>.allocate(capacity: 1)
        notes.initialize(to: cshim_pages_session())
        defer { notes.deallocate() }
        var callbacks: OpaquePointer?
        nghttp2_session_callbacks_new(&callbacks)
        defer { nghttp2_session_callbacks_del(callbacks) }
        var mem = nghttp2_mem(mem_user_data: UnsafeMutableRawPointer(notes), malloc: cshim_pages_malloc,
                              free: cshim_pages_free, calloc: cshim_pages_calloc, realloc: cshim_pages_realloc)
        var session: OpaquePointer?
        cshim_pages_session_begin(notes)
        #expect(nghttp2_session_server_new3(&session, callbacks, nil, nil, &mem) == 0)
        cshim_pages_session_end(notes)
        let buffer = try #require(notes.pointee.frame_buffer)
        #expect(notes.pointee.frame_buffer_bytes >= 16384)   // (a frame of the largest default payload)

        func drain() -> [UInt8] {
            var out: [UInt8] = []
            var chunk: UnsafePointer<UInt8>?
            while true {
                let n = nghttp2_session_mem_send(session, &chunk)
                if n <= 0 { break }
                out += UnsafeBufferPointer(start: chunk, count: n)
            }
            return out
        }
        func resident(_ p: UnsafeMutableRawPointer, _ bytes: Int) -> Int {
            var pages = [UInt8](repeating: 0, count: bytes / 4096)
            #expect(mincore(p, bytes, &pages) == 0)
            return pages.filter { $0 & 1 != 0 }.count
        }
        nghttp2_submit_settings(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), nil, 0)
        #expect(drain() == [0, 0, 0, 4, 0, 0, 0, 0, 0])   // (empty SETTINGS, written through the buffer)
        #expect(resident(buffer, notes.pointee.frame_buffer_bytes) >= 1)
        #expect(nghttp2_session_want_write(session) == 0)
        #expect(cshim_pages_session_release(notes) == notes.pointee.frame_buffer_bytes)
        #expect(resident(buffer, notes.pointee.frame_buffer_bytes) == 0)

        let data: [UInt8] = [1, 2, 3, 4, 5, 6, 7, 8]
        nghttp2_submit_ping(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), data)
        #expect(drain() == [0, 0, 8, 6, 0, 0, 0, 0, 0] + data)
        nghttp2_session_del(session)
        #expect(notes.pointee.frame_buffer == nil)   // (freed with the session: nothing left to release)
        #expect(cshim_pages_session_release(notes) == 0)
    }
}
