import HTTPFrontDoor
import Metrics

/// The routes of the HTTP/1.1 front door (WEB.md): the WebSocket API for browsers; liveness,
/// readiness and metrics for load balancers, Kubernetes probes and Prometheus.
struct FrontDoor: Sendable {
    let health: HealthService
    let metrics: NodeMetrics
    let webSocket: WebSocketAPI

    func handle(_ request: HTTPRequest) -> HTTPReply {
        let path = request.path
        if path == "/v1/ws" { return webSocket.upgrade(request) }
        guard Self.routes.contains(path) else { return .now(.text(404, "no such route: try /v1/ws, /healthz, /readyz or /metrics\n")) }
        guard request.method == "GET" || request.method == "HEAD" else {
            var r = HTTPResponse.text(405, "only GET is served here\n")
            r.headers.append(("allow", "GET, HEAD"))
            return .now(r)
        }
        switch path {
        case "/healthz":
            return .now(.text(200, "ok\n"))
        case "/readyz":
            return .now(health.isServing ? .text(200, "ready\n") : .text(503, "not ready: joining the cluster or shutting down\n"))
        case "/", "/index.html":
            return .now(Self.asset(WebAssets.indexHTML, WebAssets.indexHTMLContentType))
        case "/presence.js":
            return .now(Self.asset(WebAssets.presenceJS, WebAssets.presenceJSContentType))
        case "/metrics":
            let registry = metrics.registry
            return .later { .text(200, await registry.render(), contentType: Exposition.contentType) }
        default:
            return .now(.text(404, "no such route\n"))
        }
    }

    static let routes: Set<String> = ["/healthz", "/readyz", "/metrics", "/", "/index.html", "/presence.js"]

    private static func asset(_ text: String, _ contentType: String) -> HTTPResponse {
        HTTPResponse(status: 200, headers: [("content-type", contentType), ("cache-control", "no-cache"),
                                            ("x-content-type-options", "nosniff")], body: Array(text.utf8))
    }
}
