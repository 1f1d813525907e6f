import PresenceNode
import Testing

@Suite struct MallocTuningTests {
    /// With no tunables the node asks for its cache depth; with others it adds its own after them.
    @Test func theCacheDepthIsAddedToWhateverTunablesAreSet() {
        #expect(MallocTuning.tunables(current: nil) == "glibc.malloc.tcache_count=64")
        #expect(MallocTuning.tunables(current: "") == "glibc.malloc.tcache_count=64")
        #expect(MallocTuning.tunables(current: "glibc.malloc.arena_max=2")
                == "glibc.malloc.arena_max=2:glibc.malloc.tcache_count=64")
    }

    /// A depth already set (by the node's own re-exec, or by an operator opting out) is kept, so the
    /// node re-executes at most once.
    @Test func aDepthAlreadySetIsKeptAndNothingIsReexecuted() {
        #expect(MallocTuning.tunables(current: "glibc.malloc.tcache_count=64") == nil)
        #expect(MallocTuning.tunables(current: "glibc.malloc.tcache_count=7") == nil)
        #expect(MallocTuning.tunables(current: "glibc.malloc.arena_max=2:glibc.malloc.tcache_count=7") == nil)
        // a name that only starts like it is another tunable
        #expect(MallocTuning.tunables(current: "glibc.malloc.tcache_counter=1") == "glibc.malloc.tcache_counter=1:glibc.malloc.tcache_count=64")
    }
}
