//! RFC 9457 problem details (`application/problem+json`) made by the gateway
//! itself: no route, upstream unreachable, upstream timeouts.

use axum::body::Body;
use http::{HeaderValue, Response, StatusCode, header};

/// Base of the stable `type` URIs.
pub const TYPE_BASE: &str = "https://idemgate.dev/problems/";

/// A problem response: `kind` becomes the `type` URI's last segment.
pub fn problem(status: StatusCode, kind: &str, title: &str, detail: &str) -> Response<Body> {
    let body = serde_json::json!({
        "type": format!("{TYPE_BASE}{kind}"),
        "title": title,
        "status": status.as_u16(),
        "detail": detail,
    });
    let mut resp = Response::new(Body::from(body.to_string()));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    resp
}

/// 404: no route serves the path.
pub fn no_route(path: &str) -> Response<Body> {
    // The path is the client's own; it is echoed only in length-bounded form.
    let shown: String = path.chars().take(200).collect();
    problem(
        StatusCode::NOT_FOUND,
        "no-route",
        "No route",
        &format!("no route serves `{shown}`"),
    )
}
