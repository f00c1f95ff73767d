//! RFC 9457 problem details (`application/problem+json`) made by the gateway
//! itself: no route, admin refusals, upstream errors. They are the layer's
//! [`Problem`] type, so every problem the gateway sends has one shape and one
//! `type` URI base.

use axum::body::Body;
use axum::response::IntoResponse;
use http::{Response, StatusCode};
use idemgate_layer::problem::Problem;

/// A problem response: `kind` becomes the `type` URI's last segment.
pub fn problem(
    status: StatusCode,
    kind: &'static str,
    title: &'static str,
    detail: &str,
) -> Response<Body> {
    Problem::new(status, kind, title, detail).into_response()
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

/// 400: the path holds a dot segment (`..`, `.`, or one spelled with
/// `%2e`), an encoded slash or a backslash. Resolved after routing, such a
/// path could reach an upstream path that another route guards.
pub fn path_not_normalized(path: &str) -> Response<Body> {
    let shown: String = path.chars().take(200).collect();
    problem(
        StatusCode::BAD_REQUEST,
        "path-not-normalized",
        "Path not normalized",
        &format!(
            "the path `{shown}` has a dot segment, an encoded slash or a backslash; send the path it resolves to"
        ),
    )
}
