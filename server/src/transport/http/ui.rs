//! The web UI at `/ui/`: plain HTML, CSS and ES modules (`server/ui/`, no build step),
//! embedded in the binary. It holds no data: every page fetches the API with the
//! token the user typed into it, so these routes sit outside the token check and the
//! ACL table (the API behind them stays protected).
//!
//! Caching: the scripts and styles are served under `/ui/assets/<hash>/`, where
//! `<hash>` covers every asset (the modules import each other by relative names, so
//! one hash for the set keeps every URL content-addressed): immutable for a year. The
//! page itself (`index.html`, for every other path under `/ui/`, which the page routes
//! itself) names the current hash, and is `no-cache` with an `ETag`.
//!
//! Every answer carries a strict Content-Security-Policy (scripts and styles from this
//! origin only, nothing inline, Trusted Types required so that no string ever reaches
//! an HTML sink), `nosniff`, `frame-ancestors 'none'` with `X-Frame-Options: DENY`,
//! and `Referrer-Policy: no-referrer`.

use std::sync::LazyLock;

use axum::Router;
use axum::extract::Path;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use sha2::{Digest, Sha256};

/// One embedded file of the UI.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static [u8],
}

const JS: &str = "text/javascript; charset=utf-8";

/// Every asset served under `/ui/assets/<hash>/`.
const ASSETS: &[Asset] = &[
    Asset {
        name: "app.js",
        content_type: JS,
        body: include_bytes!("../../../ui/app.js"),
    },
    Asset {
        name: "api.js",
        content_type: JS,
        body: include_bytes!("../../../ui/api.js"),
    },
    Asset {
        name: "dom.js",
        content_type: JS,
        body: include_bytes!("../../../ui/dom.js"),
    },
    Asset {
        name: "pages.js",
        content_type: JS,
        body: include_bytes!("../../../ui/pages.js"),
    },
    Asset {
        name: "logs.js",
        content_type: JS,
        body: include_bytes!("../../../ui/logs.js"),
    },
    Asset {
        name: "terminal.js",
        content_type: JS,
        body: include_bytes!("../../../ui/terminal.js"),
    },
    Asset {
        name: "style.css",
        content_type: "text/css; charset=utf-8",
        body: include_bytes!("../../../ui/style.css"),
    },
    Asset {
        name: "favicon.svg",
        content_type: "image/svg+xml",
        body: include_bytes!("../../../ui/favicon.svg"),
    },
];

/// The page; `{{ASSETS}}` stands for `/ui/assets/<hash>`.
const INDEX_TEMPLATE: &str = include_str!("../../../ui/index.html");

/// Where the UI lives.
pub const UI_PATH: &str = "/ui/";

/// Scripts and styles from this origin only, nothing inline (no `'unsafe-inline'`,
/// no `eval`), Trusted Types so that assigning a string to `innerHTML` and the like
/// throws, and no framing.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; \
    frame-ancestors 'none'; require-trusted-types-for 'script'; trusted-types 'none'";

/// A year: the longest lifetime caches honour.
const IMMUTABLE: &str = "public, max-age=31536000, immutable";

struct Ui {
    /// Hex digest of every asset's name and content.
    hash: String,
    index: String,
    index_etag: String,
}

static UI: LazyLock<Ui> = LazyLock::new(|| {
    let mut all = Sha256::new();
    for a in ASSETS {
        // Lengths first: no two different sets hash the same by shifting bytes.
        all.update((a.name.len() as u64).to_le_bytes());
        all.update(a.name.as_bytes());
        all.update((a.body.len() as u64).to_le_bytes());
        all.update(a.body);
    }
    let hash = hex::encode(&all.finalize()[..10]);
    let index = INDEX_TEMPLATE.replace("{{ASSETS}}", &format!("/ui/assets/{hash}"));
    let index_etag = format!("\"{}\"", hex::encode(&Sha256::digest(&index)[..10]));
    Ui {
        hash,
        index,
        index_etag,
    }
});

/// The UI's routes: `/` and `/ui` redirect to `/ui/`; `/ui/assets/<hash>/<name>`
/// are the assets; any other path under `/ui/` is the page (it routes itself). Merge
/// them outside the token check: they hold no data.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/", get(|| async { Redirect::temporary(UI_PATH) }))
        .route("/ui", get(|| async { Redirect::temporary(UI_PATH) }))
        .route("/ui/", get(page))
        .route("/ui/assets/{hash}/{name}", get(asset))
        .route("/ui/{*path}", get(page))
        .layer(axum::middleware::map_response(security_headers))
}

async fn page(headers: HeaderMap) -> Response {
    let ui = &*UI;
    let fresh = headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|tag| {
            let tag = tag.trim();
            tag == "*" || tag.trim_start_matches("W/") == ui.index_etag
        });
    let etag = HeaderValue::from_str(&ui.index_etag).expect("a hex ETag is a header value");
    let common = [
        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        (header::ETAG, etag),
    ];
    if fresh {
        return (StatusCode::NOT_MODIFIED, common).into_response();
    }
    (
        common,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/html; charset=utf-8"),
        )],
        ui.index.clone(),
    )
        .into_response()
}

async fn asset(Path((hash, name)): Path<(String, String)>) -> Response {
    // An asset of another build (a page loaded before an upgrade): not this one's,
    // which may not fit that page; the page reloads itself on the next navigation.
    let found = (hash == UI.hash)
        .then(|| ASSETS.iter().find(|a| a.name == name))
        .flatten();
    match found {
        Some(a) => (
            [
                (header::CONTENT_TYPE, a.content_type),
                (header::CACHE_CONTROL, IMMUTABLE),
            ],
            a.body,
        )
            .into_response(),
        None => (
            StatusCode::NOT_FOUND,
            [
                (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
                (header::CACHE_CONTROL, "no-store"),
            ],
            "404 page not found",
        )
            .into_response(),
    }
}

async fn security_headers(mut resp: Response) -> Response {
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(
        "cross-origin-opener-policy",
        HeaderValue::from_static("same-origin"),
    );
    h.insert(
        "cross-origin-resource-policy",
        HeaderValue::from_static("same-origin"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use http_body_util::BodyExt as _;
    use tower::ServiceExt as _;

    async fn get(path: &str, headers: &[(&str, &str)]) -> (StatusCode, HeaderMap, Vec<u8>) {
        let mut req = axum::http::Request::get(path);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let resp = routes::<()>()
            .oneshot(req.body(Body::empty()).unwrap())
            .await
            .unwrap();
        let (parts, body) = resp.into_parts();
        let body = body.collect().await.unwrap().to_bytes().to_vec();
        (parts.status, parts.headers, body)
    }

    #[tokio::test]
    async fn the_page_names_content_addressed_assets_which_are_immutable() {
        let (status, h, body) = get("/ui/jobs/web", &[]).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(h[header::CONTENT_TYPE], "text/html; charset=utf-8");
        assert_eq!(h[header::CACHE_CONTROL], "no-cache");
        let page = String::from_utf8(body).unwrap();
        let app = format!("/ui/assets/{}/app.js", UI.hash);
        assert!(page.contains(&app), "{page}");
        assert!(!page.contains("{{"), "{page}");
        // No inline script or style: the CSP would refuse them.
        assert!(
            !page.contains("<script>") && !page.contains("style="),
            "{page}"
        );

        let (status, h, body) = get(&app, &[]).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(h[header::CONTENT_TYPE], JS);
        assert_eq!(h[header::CACHE_CONTROL], IMMUTABLE);
        assert_eq!(body, ASSETS[0].body);
        let (_, h, _) = get(&format!("/ui/assets/{}/style.css", UI.hash), &[]).await;
        assert_eq!(h[header::CONTENT_TYPE], "text/css; charset=utf-8");

        // Another build's hash, an unknown name: not found, never cached.
        for path in [
            "/ui/assets/0123456789abcdef0123/app.js".to_owned(),
            format!("/ui/assets/{}/nope.js", UI.hash),
            format!("/ui/assets/{}/..%2fapp.js", UI.hash),
        ] {
            let (status, h, _) = get(&path, &[]).await;
            assert_eq!(status, StatusCode::NOT_FOUND, "{path}");
            assert_eq!(h[header::CACHE_CONTROL], "no-store", "{path}");
        }
    }

    #[tokio::test]
    async fn the_page_revalidates_with_its_etag() {
        let (_, h, _) = get("/ui/", &[]).await;
        let etag = h[header::ETAG].to_str().unwrap().to_owned();
        let (status, h, body) = get("/ui/nodes", &[("if-none-match", &etag)]).await;
        assert_eq!(status, StatusCode::NOT_MODIFIED);
        assert!(body.is_empty());
        assert_eq!(h[header::ETAG], etag.as_str());
        let (status, _, _) = get("/ui/", &[("if-none-match", "\"stale\"")]).await;
        assert_eq!(status, StatusCode::OK);
    }

    #[tokio::test]
    async fn every_answer_has_the_security_headers() {
        for path in ["/", "/ui", "/ui/", "/ui/jobs", "/ui/assets/x/y.js"] {
            let (status, h, _) = get(path, &[]).await;
            assert_eq!(h[header::CONTENT_SECURITY_POLICY], CSP, "{path}");
            assert_eq!(h[header::X_CONTENT_TYPE_OPTIONS], "nosniff", "{path}");
            assert_eq!(h[header::X_FRAME_OPTIONS], "DENY", "{path}");
            assert_eq!(h[header::REFERRER_POLICY], "no-referrer", "{path}");
            if path == "/" || path == "/ui" {
                assert_eq!(status, StatusCode::TEMPORARY_REDIRECT);
                assert_eq!(h[header::LOCATION], UI_PATH);
            }
        }
        assert!(CSP.contains("frame-ancestors 'none'"));
        assert!(!CSP.contains("unsafe"));
    }
}
