import Testing
@testable import PresenceCtl

@Suite struct TopViewTests {
    @Test func theExpositionIsReadBack() {
        let text = """
        # HELP presenced_grpc_calls_total Calls
        # TYPE presenced_grpc_calls_total counter
        presenced_grpc_calls_total{method="presence.v1.Presence/Join",code="OK"} 7
        presenced_grpc_calls_total{method="a\\"b",code="NOT_FOUND"} 2
        presenced_memberships 3
        presenced_x_bucket{le="+Inf"} 4
        """
        let s = MetricsText.parse(text)
        #expect(s.count == 4)
        #expect(s[0] == MetricSample(name: "presenced_grpc_calls_total", labels: ["method": "presence.v1.Presence/Join", "code": "OK"], value: 7))
        #expect(s[1].labels["method"] == #"a"b"#)
        #expect(s[2] == MetricSample(name: "presenced_memberships", labels: [:], value: 3))
        #expect(s[3].labels["le"] == "+Inf")
    }

    @Test func ratesComeFromTwoScrapesAndTotalsAddUp() {
        func scrape(_ node: String, at: Double, calls: Double, errors: Double, sessions: Double) -> TopView.Scrape {
            TopView.Scrape(target: node + ":7402", at: at, samples: [
                MetricSample(name: "presenced_node_info", labels: ["node_id": node], value: 1),
                MetricSample(name: "presenced_grpc_calls_total", labels: ["code": "OK"], value: calls),
                MetricSample(name: "presenced_grpc_calls_total", labels: ["code": "NOT_FOUND"], value: errors),
                MetricSample(name: "presenced_sessions", labels: ["state": "connected"], value: sessions),
            ], error: nil)
        }
        let before = [scrape("n1", at: 100, calls: 10, errors: 0, sessions: 1), scrape("n2", at: 100, calls: 0, errors: 0, sessions: 2)]
        var after = [scrape("n1", at: 102, calls: 30, errors: 4, sessions: 3), scrape("n2", at: 102, calls: 8, errors: 0, sessions: 2)]
        after.append(TopView.Scrape(target: "n3:7402", at: 102, samples: [], error: "connection refused"))
        let lines = TopView.render(before: before, after: after).split(separator: "\n").map { $0.split(separator: " ").map(String.init) }
        // node, alive, sessions, waiting, channels, members, calls/s, errors/s, ...
        #expect(lines[1][0] == "n1" && lines[1][2] == "3" && lines[1][6] == "12" && lines[1][7] == "2")
        #expect(lines[2][0] == "n2" && lines[2][6] == "4" && lines[2][7] == "0")
        #expect(lines[3][0] == "n3:7402" && lines[3][1] == "-")
        #expect(lines[4][0] == "total" && lines[4].contains("16"))
        #expect(lines.last?.joined(separator: " ").contains("unreachable") == true)
    }
}
