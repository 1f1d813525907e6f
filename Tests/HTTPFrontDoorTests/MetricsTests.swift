import Metrics
import Testing

@Suite struct MetricsTests {
    @Test func countersAndHistogramsRenderInTheTextFormat() async {
        let r = MetricsRegistry()
        let calls = r.counter("x_calls_total", "Calls, by method\nand code", labels: ["method", "code"])
        calls.with("Join", "OK").add(2)
        calls.with("Join", "NOT_FOUND").add()
        let h = r.histogram("x_seconds", "Latency", labels: ["method"], buckets: [0.1, 1])
        h.with("Join").observe(0.05)
        h.with("Join").observe(0.5)
        h.with("Join").observe(3)
        r.computed("x_members", "Members", labels: ["status"]) { [Sample(["alive"], 3), Sample(["dead"], 0.5)] }
        let text = await r.render()
        #expect(text == """
        # HELP x_calls_total Calls, by method\\nand code
        # TYPE x_calls_total counter
        x_calls_total{method="Join",code="NOT_FOUND"} 1
        x_calls_total{method="Join",code="OK"} 2
        # HELP x_seconds Latency
        # TYPE x_seconds histogram
        x_seconds_bucket{method="Join",le="0.1"} 1
        x_seconds_bucket{method="Join",le="1"} 2
        x_seconds_bucket{method="Join",le="+Inf"} 3
        x_seconds_sum{method="Join"} 3.55
        x_seconds_count{method="Join"} 3
        # HELP x_members Members
        # TYPE x_members gauge
        x_members{status="alive"} 3
        x_members{status="dead"} 0.5

        """)
    }

    @Test func labelValuesAreEscaped() async {
        let r = MetricsRegistry()
        r.counter("c_total", "C", labels: ["v"]).with("a\"b\\c\nd").add()
        let text = await r.render()
        #expect(text.contains(#"c_total{v="a\"b\\c\nd"} 1"#))
    }

    @Test func aCarriageReturnAndLineFeedIsEscapedToo() async {
        // ("\r\n" is one Character in Swift: escaping goes by Unicode scalar)
        #expect(Exposition.escapeLabel("a\r\nb") == "a\r\\nb")
        let r = MetricsRegistry()
        r.counter("c_total", "Two\r\nlines", labels: ["v"]).with("x\r\ny").add()
        let text = await r.render()
        #expect(text.split(separator: "\n").count == 3, "\(text.debugDescription)")
    }

    @Test func numbersAreSpelledAsPrometheusReadsThem() {
        #expect(Exposition.number(3) == "3")
        #expect(Exposition.number(0.25) == "0.25")
        #expect(Exposition.number(.infinity) == "+Inf")
        #expect(Exposition.number(-.infinity) == "-Inf")
        #expect(Exposition.number(.nan) == "NaN")
    }

    @Test func processMetricsAreRead() async {
        let r = MetricsRegistry()
        ProcessMetrics.register(in: r, prefix: "p_")
        let text = await r.render()
        for name in ["p_process_cpu_seconds_total ", "p_process_resident_memory_bytes ", "p_process_open_fds ", "p_process_max_fds ", "p_process_start_time_seconds "] {
            let line = text.split(separator: "\n").first { $0.hasPrefix(name) }
            #expect(line.flatMap { Double($0.split(separator: " ")[1]) }.map { $0 > 0 } == true, "\(name) missing or zero")
        }
    }
}
