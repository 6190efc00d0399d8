//! Nomad's HTTP API on 127.0.0.1, called from a plain test thread: the real Nomad
//! agent's (tests/compat/nomad_agent.rs) and Drover's, which speaks the same API.

use std::time::Duration;

use serde_json::Value;

/// Nomad's HTTP API on 127.0.0.1, called from a plain test thread.
pub struct NomadApi {
    runtime: tokio::runtime::Runtime,
    client: hyper_util::client::legacy::Client<
        hyper_util::client::legacy::connect::HttpConnector,
        http_body_util::Full<bytes::Bytes>,
    >,
    base: String,
}

impl NomadApi {
    pub fn new(port: u16) -> Self {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build_http();
        NomadApi {
            runtime,
            client,
            base: format!("http://127.0.0.1:{port}"),
        }
    }

    /// The status and body of `method path` with `body`; `None` when the agent did not
    /// answer at all (not up yet).
    pub fn call(
        &self,
        method: http::Method,
        path: &str,
        body: Option<&Value>,
    ) -> Option<(u16, String)> {
        use http_body_util::BodyExt as _;
        let req = http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(http_body_util::Full::new(bytes::Bytes::from(
                body.map(Value::to_string).unwrap_or_default(),
            )))
            .unwrap();
        self.runtime.block_on(async {
            let resp = tokio::time::timeout(Duration::from_secs(10), self.client.request(req))
                .await
                .ok()?
                .ok()?;
            let status = resp.status().as_u16();
            let bytes = resp.into_body().collect().await.ok()?.to_bytes();
            Some((status, String::from_utf8_lossy(&bytes).into_owned()))
        })
    }

    pub fn get_json(&self, path: &str) -> Option<Value> {
        match self.call(http::Method::GET, path, None)? {
            (200, body) => serde_json::from_str(&body).ok(),
            _ => None,
        }
    }
}
