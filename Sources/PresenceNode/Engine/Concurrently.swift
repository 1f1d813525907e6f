/// Runs `body` for every item, at most `width` at a time, and returns the results once all have
/// finished (in no particular order). For the calls of one session to several owners: a slow or
/// unreachable owner then costs its retry window once, not once per item, and a session in
/// thousands of channels does not open thousands of calls at once.
func concurrently<Item: Sendable, Result: Sendable>(_ items: [Item], width: Int = 16,
                                                    _ body: @escaping @Sendable (Item) async -> Result) async -> [Result] {
    guard items.count > 1 else { return items.isEmpty ? [] : [await body(items[0])] }
    return await withTaskGroup(of: Result.self) { group in
        var results: [Result] = []
        results.reserveCapacity(items.count)
        var next = items.startIndex
        while next < items.endIndex && next < width {
            let item = items[next]
            group.addTask { await body(item) }
            next += 1
        }
        for await r in group {
            results.append(r)
            if next < items.endIndex {
                let item = items[next]
                group.addTask { await body(item) }
                next += 1
            }
        }
        return results
    }
}
