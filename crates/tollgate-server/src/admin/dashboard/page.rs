//! `GET /`: the dashboard page, its style and script inlined, so that it is the only path
//! served without a token. It holds no data: the script asks for the snapshot.

use std::sync::LazyLock;

use axum::http::header;
use axum::response::{IntoResponse, Response};

const HTML: &str = include_str!("../../../assets/dashboard/index.html");
const STYLE: &str = include_str!("../../../assets/dashboard/dashboard.css");
const SCRIPT: &str = include_str!("../../../assets/dashboard/dashboard.js");

/// The page with the style and script in place of their markers.
static PAGE: LazyLock<String> = LazyLock::new(|| {
    HTML.replacen("/*STYLE*/", STYLE, 1)
        .replacen("/*SCRIPT*/", SCRIPT, 1)
});

/// Nothing is loaded from elsewhere; the page may only call back to this listener.
const POLICY: &str = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; \
    connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; \
    frame-ancestors 'none'";

pub(super) async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
            (header::CONTENT_SECURITY_POLICY, POLICY),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
            (header::X_FRAME_OPTIONS, "DENY"),
        ],
        PAGE.as_str(),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_page_holds_its_style_and_script() {
        let page = super::PAGE.as_str();
        assert!(!page.contains("/*STYLE*/") && !page.contains("/*SCRIPT*/"));
        assert!(page.contains(super::SCRIPT) && page.contains(super::STYLE));
        // Nothing fetched from elsewhere.
        assert!(!page.contains("src=") && !page.contains("href=\"http"));
    }
}
