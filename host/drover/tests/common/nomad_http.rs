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
    token: Option<String>,
}

/// One answer: its status, `X-Nomad-Index` and body.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub index: Option<u64>,
    pub body: String,
}

impl Answer {
    /// The body as JSON, or a panic naming the request.
    pub fn json(&self, what: &str) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {}", self.body))
    }
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
            token: None,
        }
    }

    /// `http://127.0.0.1:PORT`: where the API (and a server's web UI) is.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// The token it sends, if any.
    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// The same API, sending `token` in `X-Nomad-Token`.
    pub fn with_token(mut self, token: &str) -> Self {
        self.token = Some(token.to_owned());
        self
    }

    fn request(
        &self,
        method: http::Method,
        path: &str,
        body: Option<&Value>,
    ) -> http::Request<http_body_util::Full<bytes::Bytes>> {
        let mut req = http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base))
            .header("content-type", "application/json");
        if let Some(token) = &self.token {
            req = req.header("x-nomad-token", token);
        }
        req.body(http_body_util::Full::new(bytes::Bytes::from(
            body.map(Value::to_string).unwrap_or_default(),
        )))
        .unwrap()
    }

    /// `method path` with `body`, waiting at most `limit` for the whole answer; `None`
    /// when nothing answered in time.
    pub fn answer(
        &self,
        method: http::Method,
        path: &str,
        body: Option<&Value>,
        limit: Duration,
    ) -> Option<Answer> {
        use http_body_util::BodyExt as _;
        let req = self.request(method, path, body);
        self.runtime.block_on(async {
            tokio::time::timeout(limit, async {
                let resp = self.client.request(req).await.ok()?;
                let status = resp.status().as_u16();
                let index = resp
                    .headers()
                    .get("x-nomad-index")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse().ok());
                let bytes = resp.into_body().collect().await.ok()?.to_bytes();
                Some(Answer {
                    status,
                    index,
                    body: String::from_utf8_lossy(&bytes).into_owned(),
                })
            })
            .await
            .ok()?
        })
    }

    /// The JSON lines of the stream at `path` (an ndjson stream such as
    /// `/v1/event/stream`), read until `done` says the lines so far are enough, or
    /// `limit` passed; empty lines and `{}` heartbeats are left out.
    pub fn read_lines(
        &self,
        path: &str,
        limit: Duration,
        mut done: impl FnMut(&[Value]) -> bool,
    ) -> Vec<Value> {
        use http_body_util::BodyExt as _;
        let req = self.request(http::Method::GET, path, None);
        self.runtime.block_on(async {
            let mut lines = Vec::new();
            let _ = tokio::time::timeout(limit, async {
                let resp = self.client.request(req).await.expect("the stream request");
                assert_eq!(resp.status().as_u16(), 200, "GET {path}");
                let mut body = resp.into_body();
                let mut pending = Vec::new();
                while let Some(frame) = body.frame().await {
                    let Ok(data) = frame.expect("the stream").into_data() else {
                        continue;
                    };
                    pending.extend_from_slice(&data);
                    while let Some(end) = pending.iter().position(|b| *b == b'\n') {
                        let line: Vec<u8> = pending.drain(..=end).collect();
                        let text = String::from_utf8_lossy(&line);
                        let text = text.trim();
                        if text.is_empty() || text == "{}" {
                            continue;
                        }
                        lines.push(serde_json::from_str(text).unwrap_or_else(|e| {
                            panic!("{path}: a line that is not JSON ({e}): {text}")
                        }));
                        if done(&lines) {
                            return;
                        }
                    }
                }
            })
            .await;
            lines
        })
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
        let req = self.request(method, path, body);
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

impl NomadApi {
    /// `GET path` answered 200, as JSON; a panic naming the request otherwise.
    pub fn get_ok(&self, path: &str) -> Value {
        let (status, body) = self
            .call(http::Method::GET, path, None)
            .unwrap_or_else(|| panic!("GET {path}: no answer"));
        assert_eq!(status, 200, "GET {path}: {body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: {e}: {body}"))
    }
}
