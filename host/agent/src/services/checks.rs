//! Running one check: `http` (2xx passing, 429 warning, anything else critical),
//! `tcp` (a connection within the timeout), `script` (a command inside the task through
//! its driver's `ExecTask`: exit 0 passing, 1 warning, else critical),
//! every `interval`, each run bounded by `timeout`; output kept up to
//! [`MAX_CHECK_OUTPUT_BYTES`].

use std::sync::{Arc, Mutex};
use std::time::Duration;

use drover_api::TaskLifecycle;
use drover_server_api::{
    CheckRestart, CheckSpec, CheckStatus, MAX_CHECK_OUTPUT_BYTES, ServiceHealth, truncate_utf8,
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{DEFAULT_CHECK_TIMEOUT, MIN_CHECK_INTERVAL, Waker, lock};
use crate::tasks::TaskManager;

/// What a check connects to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckTarget {
    /// An HTTP request to `host:port`.
    Http {
        /// Address.
        host: String,
        /// Port.
        port: u16,
    },
    /// A TCP connection to `host:port`.
    Tcp {
        /// Address.
        host: String,
        /// Port.
        port: u16,
    },
    /// A command inside the task, through its driver's `ExecTask`: exit code 0
    /// passing, 1 warning, anything else critical.
    Script {
        /// Command.
        command: String,
        /// Arguments.
        args: Vec<String>,
    },
}

/// One run's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckOutcome {
    /// Status.
    pub status: ServiceHealth,
    /// What it said.
    pub output: String,
}

impl CheckOutcome {
    fn new(status: ServiceHealth, output: impl Into<String>) -> Self {
        CheckOutcome {
            status,
            output: truncate_utf8(&output.into(), MAX_CHECK_OUTPUT_BYTES),
        }
    }
}

/// How long past its timeout the agent waits for a script check's `ExecTask` to
/// answer: the driver kills the command at the timeout and reports it.
const SCRIPT_ANSWER_GRACE: Duration = Duration::from_secs(10);

/// Everything one check's loop needs.
pub(super) struct CheckRun {
    pub spec: CheckSpec,
    pub target: CheckTarget,
    pub restart: Option<CheckRestart>,
    pub task_id: Option<String>,
    pub status: Arc<Mutex<CheckStatus>>,
    pub tasks: Arc<TaskManager>,
    pub wake: Waker,
    pub stop: CancellationToken,
}

fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Run the check once (`exec`: the task manager and the task a script runs in).
pub async fn run_once(
    spec: &CheckSpec,
    target: &CheckTarget,
    exec: Option<(&TaskManager, &str)>,
) -> CheckOutcome {
    let timeout = if spec.timeout.is_zero() {
        DEFAULT_CHECK_TIMEOUT
    } else {
        spec.timeout
    };
    let fut = async {
        match target {
            CheckTarget::Http { host, port } => http(spec, host, *port).await,
            CheckTarget::Tcp { host, port } => {
                let addr = host_port(host, *port);
                match tokio::net::TcpStream::connect(&addr).await {
                    Ok(_) => CheckOutcome::new(
                        ServiceHealth::Passing,
                        format!("TCP connect {addr}: Success"),
                    ),
                    Err(e) => CheckOutcome::new(
                        ServiceHealth::Critical,
                        format!("TCP connect {addr}: {e}"),
                    ),
                }
            }
            CheckTarget::Script { command, args } => {
                let Some((tasks, task_id)) = exec else {
                    return CheckOutcome::new(
                        ServiceHealth::Critical,
                        format!("script check {command:?}: no task to run it in"),
                    );
                };
                let mut argv = vec![command.clone()];
                argv.extend(args.iter().cloned());
                match tasks.exec(task_id, argv, timeout).await {
                    Ok(out) => {
                        let status = match (out.result.exit_code, out.result.signal) {
                            _ if out.result.err.is_some() => ServiceHealth::Critical,
                            (0, 0) => ServiceHealth::Passing,
                            (1, 0) => ServiceHealth::Warning,
                            _ => ServiceHealth::Critical,
                        };
                        let mut text = out.stdout;
                        text.truncate(MAX_CHECK_OUTPUT_BYTES);
                        if text.len() < MAX_CHECK_OUTPUT_BYTES {
                            text.extend_from_slice(&out.stderr);
                        }
                        CheckOutcome::new(status, String::from_utf8_lossy(&text))
                    }
                    Err(e) => CheckOutcome::new(
                        ServiceHealth::Critical,
                        format!("script check {command:?}: {e}"),
                    ),
                }
            }
        }
    };
    // A script's driver kills the command at `timeout` and then answers; the agent
    // waits for that answer (a little longer than `timeout`) rather than dropping the
    // call, so that the loop never starts a run while the previous one still runs.
    let limit = if matches!(target, CheckTarget::Script { .. }) {
        timeout + SCRIPT_ANSWER_GRACE
    } else {
        timeout
    };
    match tokio::time::timeout(limit, fut).await {
        Ok(o) => o,
        Err(_) => CheckOutcome::new(
            ServiceHealth::Critical,
            format!(
                "{} check timed out after {}",
                spec.check_type,
                humantime::format_duration(timeout)
            ),
        ),
    }
}

async fn http(spec: &CheckSpec, host: &str, port: u16) -> CheckOutcome {
    let method = if spec.method.is_empty() {
        "GET"
    } else {
        spec.method.as_str()
    };
    let path = if spec.path.is_empty() {
        "/"
    } else {
        spec.path.as_str()
    };
    let authority = host_port(host, port);
    let what = format!("HTTP {method} http://{authority}{path}");
    if !spec.protocol.is_empty() && spec.protocol != "http" {
        return CheckOutcome::new(
            ServiceHealth::Critical,
            format!(
                "{what}: protocol {:?} is not supported (only http)",
                spec.protocol
            ),
        );
    }
    let method_name = method;
    let method = match hyper::Method::from_bytes(method.as_bytes()) {
        Ok(m) => m,
        Err(_) => {
            return CheckOutcome::new(
                ServiceHealth::Critical,
                format!("{what}: {method:?} is not an HTTP method"),
            );
        }
    };
    let stream = match tokio::net::TcpStream::connect(&authority).await {
        Ok(s) => s,
        Err(e) => return CheckOutcome::new(ServiceHealth::Critical, format!("{what}: {e}")),
    };
    let (mut sender, conn) =
        match hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await {
            Ok(x) => x,
            Err(e) => return CheckOutcome::new(ServiceHealth::Critical, format!("{what}: {e}")),
        };
    let conn = tokio::spawn(conn);
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header(hyper::header::HOST, &authority)
        .header(hyper::header::USER_AGENT, "Drover Health Check");
    for (name, values) in &spec.header {
        for v in values {
            req = req.header(name.as_str(), v.as_str());
        }
    }
    let req = match req.body(http_body_util::Empty::<bytes::Bytes>::new()) {
        Ok(r) => r,
        Err(e) => return CheckOutcome::new(ServiceHealth::Critical, format!("{what}: {e}")),
    };
    let outcome = match sender.send_request(req).await {
        Ok(resp) => {
            let code = resp.status();
            let status = if code.is_success() {
                ServiceHealth::Passing
            } else if code == hyper::StatusCode::TOO_MANY_REQUESTS {
                ServiceHealth::Warning
            } else {
                ServiceHealth::Critical
            };
            // The status line only: the body is the service's (it may hold what a
            // job fetched from anywhere) and would be kept and served by the server.
            drop(resp);
            CheckOutcome::new(status, format!("HTTP {method_name} {path}: {code}"))
        }
        Err(e) => CheckOutcome::new(ServiceHealth::Critical, format!("{what}: {e}")),
    };
    conn.abort();
    outcome
}

/// Run the check every interval until stopped; report status changes; restart the
/// task after `check_restart.limit` failures in a row.
pub(super) async fn run(c: CheckRun) {
    let interval = c.spec.interval.max(MIN_CHECK_INTERVAL);
    let limit = c.restart.map_or(0, |r| r.limit);
    let grace = c.restart.map_or(Duration::ZERO, |r| r.grace);
    let mut failures: u32 = 0;
    let mut seen_starts: Option<u32> = None;
    let mut counting_from = Instant::now() + grace;
    loop {
        let exec = c.task_id.as_deref().map(|id| (&*c.tasks, id));
        let outcome = tokio::select! {
            o = run_once(&c.spec, &c.target, exec) => o,
            () = c.stop.cancelled() => return,
        };
        let changed = {
            let mut st = lock(&c.status);
            let changed = st.status != outcome.status;
            st.status = outcome.status;
            st.output.clone_from(&outcome.output);
            changed
        };
        if changed {
            // Without the output: that is the task's, not for the agent's logs.
            tracing::info!(check = %lock(&c.status).name, status = outcome.status.as_str(), "check status changed");
            (c.wake)();
        }
        if let (true, Some(task_id)) = (limit > 0, c.task_id.as_deref()) {
            let view = c.tasks.status(task_id).ok();
            let running = view
                .as_ref()
                .is_some_and(|v| v.state == TaskLifecycle::Running);
            let starts = view
                .as_ref()
                .map(|v| v.restarts + u32::from(v.started_at.is_some()));
            if seen_starts != starts {
                // A new incarnation: its grace begins, earlier failures are forgotten.
                seen_starts = starts;
                failures = 0;
                counting_from = Instant::now() + grace;
            }
            let ignore_warnings = c.restart.is_some_and(|r| r.ignore_warnings);
            let failed = match outcome.status {
                ServiceHealth::Critical => true,
                ServiceHealth::Warning => !ignore_warnings,
                ServiceHealth::Passing | ServiceHealth::Pending => false,
            };
            if !running || !failed {
                failures = 0;
            } else if Instant::now() >= counting_from {
                failures += 1;
            }
            if failures >= limit {
                failures = 0;
                let name = lock(&c.status).name.clone();
                let why = format!(
                    "check {name:?} failed {limit} times in a row ({}); restarting the task",
                    outcome.status.as_str()
                );
                tracing::info!(task = %task_id, "{why}");
                if let Err(e) = c.tasks.restart(task_id, &why).await {
                    tracing::warn!(task = %task_id, "restarting the task for its failing check failed: {e}");
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep(interval) => {}
            () = c.stop.cancelled() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(kind: &str) -> CheckSpec {
        CheckSpec {
            name: "c".into(),
            check_type: kind.into(),
            interval: Duration::from_secs(1),
            timeout: Duration::from_secs(2),
            path: "/health".into(),
            method: String::new(),
            protocol: String::new(),
            header: Default::default(),
            port: String::new(),
            command: String::new(),
            args: Vec::new(),
            task: String::new(),
            expose: false,
            check_restart: None,
        }
    }

    /// A one-shot HTTP server on 127.0.0.1 answering `status` with a long body.
    async fn serve(status: u16) -> u16 {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf).await;
            let body = "x".repeat(10_000);
            let resp = format!(
                "HTTP/1.1 {status} S\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
            let _ = s.write_all(resp.as_bytes()).await;
        });
        port
    }

    #[tokio::test]
    async fn http_checks_map_status_codes_and_keep_only_the_status_line() {
        for (code, want) in [
            (200, ServiceHealth::Passing),
            (429, ServiceHealth::Warning),
            (503, ServiceHealth::Critical),
        ] {
            let port = serve(code).await;
            let o = run_once(
                &spec("http"),
                &CheckTarget::Http {
                    host: "127.0.0.1".into(),
                    port,
                },
                None,
            )
            .await;
            assert_eq!(o.status, want, "{code}: {}", o.output);
            let line = hyper::StatusCode::from_u16(code).unwrap().to_string();
            assert_eq!(
                o.output,
                format!("HTTP GET /health: {line}"),
                "the status line only, never the body"
            );
        }
    }

    #[tokio::test]
    async fn tcp_checks_pass_on_a_listener_and_fail_without_one() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let target = CheckTarget::Tcp {
            host: "127.0.0.1".into(),
            port,
        };
        assert_eq!(
            run_once(&spec("tcp"), &target, None).await.status,
            ServiceHealth::Passing
        );
        // A port bound and not listening (and not SO_REUSEADDR, so that no other test
        // can take it meanwhile, as a freed port could be): refused.
        let holder = tokio::net::TcpSocket::new_v4().unwrap();
        holder.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let closed = CheckTarget::Tcp {
            host: "127.0.0.1".into(),
            port: holder.local_addr().unwrap().port(),
        };
        let o = run_once(&spec("tcp"), &closed, None).await;
        assert_eq!(o.status, ServiceHealth::Critical, "{}", o.output);
        drop(l);
    }
}
