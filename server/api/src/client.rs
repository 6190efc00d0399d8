//! A typed client of the server's HTTP API (`/v1/...`), over TCP (`http://HOST:PORT`,
//! or `https://HOST:PORT` with a CA file) or over a client agent's unix socket
//! (`unix:///path/api.sock`: the agent forwards to its servers).
//!
//! The API is Nomad's: the client sends and decodes the wire types of
//! [`crate::nomad`] (PascalCase JSON, `X-Nomad-Token`, `X-Nomad-Index`) and hands the
//! CLI Drover's internal types, converted from them. Lists are Nomad's stubs: what a
//! stub lacks (an allocation's resources, a node's attributes) is empty in the
//! internal objects of a list; the single-object reads have everything.
//!
//! One connection per request: the CLI makes a handful of requests, and a blocking
//! query may hold its connection for minutes anyway.
//!
//! ```no_run
//! # async fn example() -> Result<(), drover_server_api::client::Error> {
//! use drover_server_api::client::{Client, ClientOptions, QueryOptions};
//!
//! let client = Client::new("http://127.0.0.1:4646", ClientOptions::default())?;
//! let jobs = client.jobs(&QueryOptions::default()).await?;
//! // Wait up to 30s for anything newer than what we saw.
//! let next = client.jobs(&QueryOptions::blocking(jobs.index, std::time::Duration::from_secs(30))).await?;
//! println!("{} jobs at index {}", next.value.len(), next.index);
//! # Ok(()) }
//! ```

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use drover_api::{Frame, encode_path_segment};
use http_body_util::{BodyExt as _, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, StatusCode, header};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::io::{AsyncRead, AsyncWrite};

mod acl;
mod namespaces;

use crate::client_fs::AllocFileInfo;
use crate::nomad;
use crate::{
    AllocLogsQuery, Allocation, Deployment, DeploymentUpdateResponse, Evaluation, INDEX_HEADER,
    Index, Job, JobListStub, JobPlanResponse, JobRegisterResponse, JobSpec, Node,
    NodeDrainResponse, ServersStatus, TOKEN_HEADER,
};

/// How long connecting (TCP and TLS) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Largest answer read into memory (a list of 100,000 allocations is ~100 MiB of JSON;
/// more than that is not an answer a CLI should hold).
const MAX_ANSWER_BYTES: usize = 256 * 1024 * 1024;

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The address is not one this client speaks.
    #[error("address {address:?}: {reason}")]
    Address {
        /// As given.
        address: String,
        /// What is wrong with it.
        reason: String,
    },
    /// TLS settings could not be used (CA file unreadable, ...).
    #[error("TLS: {0}")]
    Tls(String),
    /// Nothing answered at the address; the request was not sent.
    #[error("cannot reach {address}: {reason}")]
    Connect {
        /// The address.
        address: String,
        /// Why.
        reason: String,
    },
    /// The connection failed after the request was sent: it may or may not have acted.
    #[error("the request to {address} failed: {reason}")]
    Request {
        /// The address.
        address: String,
        /// Why.
        reason: String,
    },
    /// The server (or agent) answered with an error status; `message` is its words.
    #[error("{message}")]
    Status {
        /// The HTTP status.
        status: StatusCode,
        /// What it said.
        message: String,
    },
    /// The answer is not the JSON the API promises.
    #[error("cannot decode the answer to {request}: {source}")]
    Decode {
        /// The request, e.g. `GET /v1/jobs`.
        request: String,
        /// What serde found.
        #[source]
        source: serde_json::Error,
    },
    /// The answer decoded but does not convert into Drover's types (a job holding
    /// what Drover cannot run).
    #[error("cannot use the answer to {request}: {source}")]
    Convert {
        /// The request.
        request: String,
        /// What the conversion refused.
        #[source]
        source: nomad::ConversionError,
    },
    /// Reading the answer failed part-way, or it was too large.
    #[error("the answer to {request} broke off: {reason}")]
    Body {
        /// The request.
        request: String,
        /// Why.
        reason: String,
    },
    /// A log stream that had begun was ended by an error reported in it.
    #[error("{0}")]
    Stream(String),
    /// The request cannot be made as asked (nothing was sent).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
}

impl Error {
    /// The HTTP status of an error answer.
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            Error::Status { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The answer was 404.
    pub fn is_not_found(&self) -> bool {
        self.status() == Some(StatusCode::NOT_FOUND)
    }
}

/// How to talk to the server.
#[derive(Debug, Clone, Default)]
pub struct ClientOptions {
    /// Sent as `X-Nomad-Token` with every request.
    pub token: Option<String>,
    /// CA file (PEM) the server's certificate must chain to, for `https://`.
    pub ca_file: Option<PathBuf>,
    /// Client certificate and key (PEM) for mutual TLS.
    pub client_cert: Option<(PathBuf, PathBuf)>,
    /// Sent as `?namespace=` with every request that names none itself (Nomad's
    /// `-namespace`, `NOMAD_NAMESPACE`); `None`: the server's `default`.
    pub namespace: Option<String>,
}

/// Blocking-query parameters of a read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueryOptions {
    /// Wait for something newer than this index (0: answer at once).
    pub index: Index,
    /// For at most this long (the server caps it at 5 minutes).
    pub wait: Option<Duration>,
}

impl QueryOptions {
    /// A blocking query: wait until the index passes `index`, at most `wait`.
    pub fn blocking(index: Index, wait: Duration) -> QueryOptions {
        QueryOptions {
            index,
            wait: Some(wait),
        }
    }

    fn query(&self) -> Option<String> {
        if self.index == 0 {
            return None;
        }
        let mut q = format!("index={}", self.index);
        if let Some(w) = self.wait {
            q.push_str(&format!("&wait={}ms", w.as_millis()));
        }
        Some(q)
    }
}

/// An answer and the index it was read at (`X-Nomad-Index`).
#[derive(Debug, Clone, PartialEq)]
pub struct Answer<T> {
    /// What was read.
    pub value: T,
    /// The index of the state it was read at: pass it to the next blocking query.
    pub index: Index,
}

impl<T> Answer<T> {
    /// The same answer with its value converted.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Answer<U> {
        Answer {
            value: f(self.value),
            index: self.index,
        }
    }
}

/// An answer as it came, whatever its status: see [`Client::raw`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawAnswer {
    /// The HTTP status.
    pub status: StatusCode,
    /// `X-Nomad-Index`, when present.
    pub index: Option<Index>,
    /// The whole body.
    pub body: Vec<u8>,
}

impl RawAnswer {
    /// The `error` of a JSON error body, or the text of a plain one (Nomad answers
    /// errors in plain text).
    pub fn error_message(&self) -> Option<String> {
        match serde_json::from_slice::<serde_json::Value>(&self.body) {
            Ok(v) => v.get("error")?.as_str().map(str::to_owned),
            Err(_) => {
                let text = String::from_utf8_lossy(&self.body).trim().to_owned();
                (!text.is_empty()).then_some(text)
            }
        }
    }
}

#[derive(Clone)]
enum Target {
    Tcp {
        host: String,
        port: u16,
        tls: Option<(
            tokio_rustls::TlsConnector,
            rustls::pki_types::ServerName<'static>,
        )>,
    },
    Unix(PathBuf),
}

/// A client of one server's (or agent's) API. Cloning is cheap.
#[derive(Clone)]
pub struct Client {
    address: String,
    target: Target,
    token: Option<hyper::header::HeaderValue>,
    namespace: Option<String>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the token.
        f.debug_struct("Client")
            .field("address", &self.address)
            .finish_non_exhaustive()
    }
}

/// The exec WebSocket of [`Client::alloc_exec`].
pub type ExecSocket = tokio_tungstenite::WebSocketStream<Box<dyn Io>>;

/// A connection to the server or agent (unix socket, TCP, TLS).
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

impl Client {
    /// A client for `address`: `http://HOST:PORT`, `https://HOST:PORT` (needs
    /// `options.ca_file`), or `unix:///path/api.sock` (an agent). Nothing is connected
    /// until the first call.
    pub fn new(address: &str, options: ClientOptions) -> Result<Client, Error> {
        let bad = |reason: &str| Error::Address {
            address: address.to_owned(),
            reason: reason.to_owned(),
        };
        let target = if let Some(path) = address.strip_prefix("unix://") {
            if path.is_empty() {
                return Err(bad("no socket path after unix://"));
            }
            Target::Unix(PathBuf::from(path))
        } else {
            let (https, rest) = if let Some(rest) = address.strip_prefix("http://") {
                (false, rest)
            } else if let Some(rest) = address.strip_prefix("https://") {
                (true, rest)
            } else {
                return Err(bad(
                    "expected http://HOST:PORT, https://HOST:PORT or unix:///path/to/api.sock",
                ));
            };
            let rest = rest.trim_end_matches('/');
            if rest.contains('/') {
                return Err(bad("give only HOST:PORT after the scheme, no path"));
            }
            let (host, port) = match rest.rsplit_once(':') {
                Some((h, p)) if !h.is_empty() && !p.contains(']') => {
                    let port = p
                        .parse::<u16>()
                        .map_err(|_| bad(&format!("port {p:?} is not a number up to 65535")))?;
                    (h.to_owned(), port)
                }
                _ => (rest.to_owned(), if https { 443 } else { 80 }),
            };
            if host.is_empty() {
                return Err(bad("no host"));
            }
            let host = host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned();
            let tls = if https {
                Some(tls_connector(&host, &options)?)
            } else {
                if options.ca_file.is_some() {
                    return Err(bad("a CA file was given, but the address is not https://"));
                }
                None
            };
            Target::Tcp { host, port, tls }
        };
        let token = match options.token {
            None => None,
            Some(t) => Some(hyper::header::HeaderValue::from_str(t.trim()).map_err(|_| {
                Error::InvalidRequest("the token holds characters a header cannot carry".into())
            })?),
        };
        if let Some(ns) = &options.namespace
            && ns != "*"
        {
            crate::namespaces::check_namespace_name(ns)
                .map_err(|why| Error::InvalidRequest(format!("namespace {ns:?}: {why}")))?;
        }
        Ok(Client {
            address: address.to_owned(),
            target,
            token,
            namespace: options.namespace.filter(|n| !n.is_empty()),
        })
    }

    /// This client, its requests naming namespace `ns` (what `nomad job run` does
    /// for a job file that names its namespace).
    pub fn with_namespace(&self, ns: &str) -> Client {
        Client {
            namespace: Some(ns.to_owned()),
            ..self.clone()
        }
    }

    /// The namespace sent with requests that name none (`None`: the server's
    /// `default`).
    pub fn namespace(&self) -> Option<&str> {
        self.namespace.as_deref()
    }

    /// The address as given.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Whether the address is an agent's socket (which forwards to its servers).
    pub fn is_agent(&self) -> bool {
        matches!(self.target, Target::Unix(_))
    }

    // --- jobs -----------------------------------------------------------------------

    /// `GET /v1/jobs`: Nomad's stubs as Drover's.
    pub async fn jobs(&self, q: &QueryOptions) -> Result<Answer<Vec<JobListStub>>, Error> {
        let a: Answer<Vec<nomad::JobListStub>> = self.read(&["v1", "jobs"], q).await?;
        Ok(a.map(|v| v.iter().map(JobListStub::from).collect()))
    }

    /// `PUT /v1/jobs` with `{"Job": ...}`: register a job (or a new version); creates
    /// an evaluation.
    pub async fn register_job(&self, job: &JobSpec) -> Result<JobRegisterResponse, Error> {
        self.register_nomad_job(&nomad::Job::from(job)).await
    }

    /// `PUT /v1/jobs` with a job in Nomad's shape as it is (an HCL job file's, or a
    /// JSON job's): the server converts it.
    pub async fn register_nomad_job(&self, job: &nomad::Job) -> Result<JobRegisterResponse, Error> {
        let body = nomad::JobRegisterRequest::new(job.clone());
        let r: nomad::JobRegisterResponse = self
            .write(
                Method::PUT,
                &["v1", "jobs"],
                job_namespace(job),
                Some(&body),
            )
            .await?;
        Ok(JobRegisterResponse::from(&r))
    }

    /// `PUT /v1/job/{name}/plan`: what registering `job` would do; commits nothing.
    pub async fn plan_job(&self, job: &JobSpec) -> Result<JobPlanResponse, Error> {
        self.plan_nomad_job(&nomad::Job::from(job)).await
    }

    /// `PUT /v1/job/{id}/plan` with a job in Nomad's shape as it is.
    pub async fn plan_nomad_job(&self, job: &nomad::Job) -> Result<JobPlanResponse, Error> {
        let id = job
            .id
            .clone()
            .filter(|id| !id.is_empty())
            .or_else(|| job.name.clone())
            .unwrap_or_default();
        let body = nomad::JobPlanRequest {
            job: job.clone(),
            diff: true,
            policy_override: false,
        };
        let r: nomad::JobPlanResponse = self
            .write(
                Method::PUT,
                &["v1", "job", &id, "plan"],
                job_namespace(job),
                Some(&body),
            )
            .await?;
        Ok(JobPlanResponse::from(&r))
    }

    /// `GET /v1/job/{name}`, as Drover keeps it.
    pub async fn job(&self, name: &str, q: &QueryOptions) -> Result<Answer<Job>, Error> {
        let a = self.nomad_job(name, q).await?;
        let job = a.value.to_internal().map_err(|source| Error::Convert {
            request: format!("GET /v1/job/{name}"),
            source,
        })?;
        Ok(Answer {
            value: job,
            index: a.index,
        })
    }

    /// `GET /v1/job/{name}` in Nomad's shape.
    pub async fn nomad_job(
        &self,
        name: &str,
        q: &QueryOptions,
    ) -> Result<Answer<nomad::Job>, Error> {
        self.read(&["v1", "job", name], q).await
    }

    /// `DELETE /v1/job/{name}`: stop a job (and with `purge` forget it).
    pub async fn stop_job(&self, name: &str, purge: bool) -> Result<JobRegisterResponse, Error> {
        let query = purge.then(|| "purge=true".to_owned());
        let r: nomad::JobDeregisterResponse = self
            .write::<(), _>(Method::DELETE, &["v1", "job", name], query, None)
            .await?;
        Ok(JobRegisterResponse::from(&r))
    }

    /// `GET /v1/job/{name}/allocations`, newest first (from Nomad's stubs: no
    /// resources, no previous or next allocation).
    pub async fn job_allocations(
        &self,
        name: &str,
        q: &QueryOptions,
    ) -> Result<Answer<Vec<Allocation>>, Error> {
        let a: Answer<Vec<nomad::AllocationListStub>> =
            self.read(&["v1", "job", name, "allocations"], q).await?;
        Ok(a.map(|v| {
            v.iter()
                .map(nomad::AllocationListStub::to_internal)
                .collect()
        }))
    }

    /// `GET /v1/job/{name}/evaluations`, newest first.
    pub async fn job_evaluations(
        &self,
        name: &str,
        q: &QueryOptions,
    ) -> Result<Answer<Vec<Evaluation>>, Error> {
        let a: Answer<Vec<nomad::Evaluation>> =
            self.read(&["v1", "job", name, "evaluations"], q).await?;
        Ok(a.map(|v| v.iter().map(nomad::Evaluation::to_internal).collect()))
    }

    /// `GET /v1/job/{name}/versions`: the versions kept, newest first.
    pub async fn job_versions(
        &self,
        name: &str,
        q: &QueryOptions,
    ) -> Result<Answer<Vec<Job>>, Error> {
        let a: Answer<nomad::JobVersionsResponse> =
            self.read(&["v1", "job", name, "versions"], q).await?;
        let mut out = Vec::with_capacity(a.value.versions.len());
        for v in &a.value.versions {
            out.push(v.to_internal().map_err(|source| Error::Convert {
                request: format!("GET /v1/job/{name}/versions"),
                source,
            })?);
        }
        Ok(Answer {
            value: out,
            index: a.index,
        })
    }

    /// `PUT /v1/job/{name}/revert`: register version `version` again as the newest;
    /// with `enforce_prior_version`, only if the current version is that one.
    pub async fn revert_job(
        &self,
        name: &str,
        version: u64,
        enforce_prior_version: Option<u64>,
    ) -> Result<JobRegisterResponse, Error> {
        let body = nomad::JobRevertRequest {
            job_id: name.to_owned(),
            job_version: version,
            enforce_prior_version,
        };
        let r: nomad::JobRegisterResponse = self
            .write(
                Method::PUT,
                &["v1", "job", name, "revert"],
                None,
                Some(&body),
            )
            .await?;
        Ok(JobRegisterResponse::from(&r))
    }

    /// `PUT /v1/job/{name}/scale`: set the count of `group`.
    pub async fn scale_job(
        &self,
        name: &str,
        group: &str,
        count: u32,
    ) -> Result<JobRegisterResponse, Error> {
        let body = serde_json::json!({
            "Count": count,
            "Target": { "Job": name, "Group": group },
        });
        let r: nomad::JobRegisterResponse = self
            .write(
                Method::PUT,
                &["v1", "job", name, "scale"],
                None,
                Some(&body),
            )
            .await?;
        Ok(JobRegisterResponse::from(&r))
    }

    /// `GET /v1/job/{name}/deployments`: the job's deployments, newest first.
    pub async fn job_deployments(
        &self,
        name: &str,
        q: &QueryOptions,
    ) -> Result<Answer<Vec<Deployment>>, Error> {
        let a: Answer<Vec<nomad::Deployment>> =
            self.read(&["v1", "job", name, "deployments"], q).await?;
        Ok(a.map(|v| v.iter().map(nomad::Deployment::to_internal).collect()))
    }

    /// `GET /v1/job/{name}/deployment`: the job's newest deployment, if any.
    pub async fn latest_job_deployment(
        &self,
        name: &str,
        q: &QueryOptions,
    ) -> Result<Answer<Option<Deployment>>, Error> {
        let a: Answer<Option<nomad::Deployment>> =
            self.read(&["v1", "job", name, "deployment"], q).await?;
        Ok(a.map(|d| d.as_ref().map(nomad::Deployment::to_internal)))
    }

    // --- deployments ----------------------------------------------------------------

    /// `GET /v1/deployments`: every deployment, newest first.
    pub async fn deployments(&self, q: &QueryOptions) -> Result<Answer<Vec<Deployment>>, Error> {
        let a: Answer<Vec<nomad::Deployment>> = self.read(&["v1", "deployments"], q).await?;
        Ok(a.map(|v| v.iter().map(nomad::Deployment::to_internal).collect()))
    }

    /// `GET /v1/deployment/{id}` (an id or a unique prefix).
    pub async fn deployment(
        &self,
        id: &str,
        q: &QueryOptions,
    ) -> Result<Answer<Deployment>, Error> {
        let a: Answer<nomad::Deployment> = self.read(&["v1", "deployment", id], q).await?;
        Ok(a.map(|d| d.to_internal()))
    }

    /// `GET /v1/deployment/allocations/{id}`: the allocations it placed (from stubs).
    pub async fn deployment_allocations(
        &self,
        id: &str,
        q: &QueryOptions,
    ) -> Result<Answer<Vec<Allocation>>, Error> {
        let a: Answer<Vec<nomad::AllocationListStub>> = self
            .read(&["v1", "deployment", "allocations", id], q)
            .await?;
        Ok(a.map(|v| {
            v.iter()
                .map(nomad::AllocationListStub::to_internal)
                .collect()
        }))
    }

    /// `PUT /v1/deployment/promote/{id}`: promote the canaries of `groups` (of every
    /// group when `None`).
    pub async fn promote_deployment(
        &self,
        id: &str,
        groups: Option<Vec<String>>,
    ) -> Result<DeploymentUpdateResponse, Error> {
        let body = nomad::DeploymentPromoteRequest {
            deployment_id: id.to_owned(),
            all: groups.is_none(),
            groups: groups.unwrap_or_default(),
        };
        let r: nomad::DeploymentUpdateResponse = self
            .write(
                Method::PUT,
                &["v1", "deployment", "promote", id],
                None,
                Some(&body),
            )
            .await?;
        Ok(deployment_update(&r))
    }

    /// `PUT /v1/deployment/fail/{id}`: mark a running deployment failed (with
    /// `auto_revert`, the job goes back to its last stable version).
    pub async fn fail_deployment(&self, id: &str) -> Result<DeploymentUpdateResponse, Error> {
        let r: nomad::DeploymentUpdateResponse = self
            .write::<(), _>(Method::PUT, &["v1", "deployment", "fail", id], None, None)
            .await?;
        Ok(deployment_update(&r))
    }

    // --- nodes ----------------------------------------------------------------------

    /// `GET /v1/nodes` (from Nomad's stubs: no attributes or meta).
    pub async fn nodes(&self, q: &QueryOptions) -> Result<Answer<Vec<Node>>, Error> {
        let a: Answer<Vec<nomad::NodeListStub>> = self.read(&["v1", "nodes"], q).await?;
        Ok(a.map(|v| v.iter().map(nomad::NodeListStub::to_internal).collect()))
    }

    /// `GET /v1/node/{id}` (an id or a unique name).
    pub async fn node(&self, id: &str, q: &QueryOptions) -> Result<Answer<Node>, Error> {
        let a: Answer<nomad::Node> = self.read(&["v1", "node", id], q).await?;
        Ok(a.map(|n| n.to_internal()))
    }

    /// `GET /v1/node/{id}/allocations`.
    pub async fn node_allocations(
        &self,
        id: &str,
        q: &QueryOptions,
    ) -> Result<Answer<Vec<Allocation>>, Error> {
        let a: Answer<Vec<nomad::Allocation>> =
            self.read(&["v1", "node", id, "allocations"], q).await?;
        Ok(a.map(|v| v.iter().map(nomad::Allocation::to_internal).collect()))
    }

    /// `POST /v1/node/{id}/drain`: start (`enable`) or end a node's drain (Nomad's
    /// body: a `DrainSpec` without deadline, or none and `MarkEligible`).
    pub async fn drain_node(&self, id: &str, enable: bool) -> Result<NodeDrainResponse, Error> {
        let body = nomad::NodeDrainRequest {
            node_id: id.to_owned(),
            drain_spec: enable.then(nomad::DrainSpec::default),
            mark_eligible: !enable,
            meta: None,
        };
        let r: nomad::NodeDrainUpdateResponse = self
            .write(
                Method::POST,
                &["v1", "node", id, "drain"],
                None,
                Some(&body),
            )
            .await?;
        Ok(NodeDrainResponse { index: r.index })
    }

    // --- allocations and evaluations ----------------------------------------------

    /// `GET /v1/allocations` (from Nomad's stubs).
    pub async fn allocations(&self, q: &QueryOptions) -> Result<Answer<Vec<Allocation>>, Error> {
        let a: Answer<Vec<nomad::AllocationListStub>> =
            self.read(&["v1", "allocations"], q).await?;
        Ok(a.map(|v| {
            v.iter()
                .map(nomad::AllocationListStub::to_internal)
                .collect()
        }))
    }

    /// `GET /v1/allocation/{id}` (an id or a unique prefix).
    pub async fn allocation(
        &self,
        id: &str,
        q: &QueryOptions,
    ) -> Result<Answer<Allocation>, Error> {
        let a: Answer<nomad::Allocation> = self.read(&["v1", "allocation", id], q).await?;
        Ok(a.map(|a| a.to_internal()))
    }

    /// `GET /v1/evaluations`.
    pub async fn evaluations(&self, q: &QueryOptions) -> Result<Answer<Vec<Evaluation>>, Error> {
        let a: Answer<Vec<nomad::Evaluation>> = self.read(&["v1", "evaluations"], q).await?;
        Ok(a.map(|v| v.iter().map(nomad::Evaluation::to_internal).collect()))
    }

    /// `GET /v1/evaluation/{id}` (an id or a unique prefix).
    pub async fn evaluation(
        &self,
        id: &str,
        q: &QueryOptions,
    ) -> Result<Answer<Evaluation>, Error> {
        let a: Answer<nomad::Evaluation> = self.read(&["v1", "evaluation", id], q).await?;
        Ok(a.map(|e| e.to_internal()))
    }

    /// `GET /v1/services`: the registered services, by namespace.
    pub async fn services(
        &self,
        q: &QueryOptions,
    ) -> Result<Answer<Vec<crate::services::NomadServiceNamespace>>, Error> {
        self.read(&["v1", "services"], q).await
    }

    /// `GET /v1/service/{name}`: its healthy instances, or every one with `all`.
    pub async fn service(
        &self,
        name: &str,
        all: bool,
        q: &QueryOptions,
    ) -> Result<Answer<Vec<crate::services::NomadServiceRegistration>>, Error> {
        let path = path(&["v1", "service", name])?;
        let request = format!("GET {path}");
        let mut query: Vec<String> = q.query().into_iter().collect();
        if all {
            query.push("all=true".to_owned());
        }
        let query = (!query.is_empty()).then(|| query.join("&"));
        let resp = self.send(Method::GET, &path, query, None).await?;
        let status = resp.status();
        let index = index_of(resp.headers()).unwrap_or(0);
        let body = read_body(&request, resp.into_body()).await?;
        if status != StatusCode::OK {
            return Err(refusal(&request, status, &body));
        }
        let value =
            serde_json::from_slice(&body).map_err(|source| Error::Decode { request, source })?;
        Ok(Answer { value, index })
    }

    /// `GET /v1/status/servers`: the cluster's servers, its leader and its store
    /// (`drover server status`).
    pub async fn servers_status(&self) -> Result<Answer<ServersStatus>, Error> {
        self.read(&["v1", "status", "servers"], &QueryOptions::default())
            .await
    }

    /// `GET /v1/client/fs/logs/{alloc}?task=...`: a task's log, from Nomad's JSON
    /// frames. Only the agent of the node running the allocation has it (a server
    /// answers which node that is).
    pub async fn alloc_logs(
        &self,
        alloc: &str,
        query: &AllocLogsQuery,
    ) -> Result<AllocLogFrames, Error> {
        if query.tail.is_some() {
            return Err(Error::InvalidRequest(
                "the client fs logs API starts at a byte offset, not at the last N lines".into(),
            ));
        }
        let stream = match query.stream {
            drover_api::LogStream::Stdout => "stdout",
            drover_api::LogStream::Stderr => "stderr",
        };
        let follow = if query.follow { "true" } else { "false" };
        let q = serde_urlencoded::to_string([
            ("task", query.task.as_str()),
            ("type", stream),
            ("follow", follow),
            ("origin", "start"),
            ("offset", "0"),
            ("plain", "false"),
        ])
        .map_err(|e| Error::InvalidRequest(format!("cannot encode the query: {e}")))?;
        let path = path(&["v1", "client", "fs", "logs", alloc])?;
        let (request, resp) = self.get_streaming(&path, q).await?;
        let got = resp
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        if !got.starts_with("application/json") {
            return Err(Error::Body {
                request,
                reason: format!("content type {got:?}, expected \"application/json\""),
            });
        }
        Ok(AllocLogFrames {
            request,
            body: resp.into_body(),
            buf: Vec::new(),
            done: false,
        })
    }

    /// `GET /v1/client/fs/ls/{alloc}?path=P`: the entries of a directory of the
    /// allocation's directory (`/` holds `alloc/` and one directory per task).
    pub async fn alloc_fs_ls(&self, alloc: &str, path: &str) -> Result<Vec<AllocFileInfo>, Error> {
        self.alloc_fs_json("ls", alloc, path).await
    }

    /// `GET /v1/client/fs/stat/{alloc}?path=P`: what one path of the allocation's
    /// directory is (a link is described, not followed).
    pub async fn alloc_fs_stat(&self, alloc: &str, path: &str) -> Result<AllocFileInfo, Error> {
        self.alloc_fs_json("stat", alloc, path).await
    }

    async fn alloc_fs_json<T: DeserializeOwned>(
        &self,
        what: &str,
        alloc: &str,
        file: &str,
    ) -> Result<T, Error> {
        let q = serde_urlencoded::to_string([("path", file)])
            .map_err(|e| Error::InvalidRequest(format!("cannot encode the query: {e}")))?;
        let path = path(&["v1", "client", "fs", what, alloc])?;
        let request = format!("GET {path}");
        let resp = self.send(Method::GET, &path, Some(q), None).await?;
        let status = resp.status();
        let body = read_body(&request, resp.into_body()).await?;
        if status != StatusCode::OK {
            return Err(refusal(&request, status, &body));
        }
        serde_json::from_slice(&body).map_err(|source| Error::Decode { request, source })
    }

    /// A file of the allocation's directory: whole (`GET /v1/client/fs/cat/...`), or
    /// `limit` bytes from `offset` (`GET /v1/client/fs/readat/...`), read a piece at a
    /// time.
    pub async fn alloc_fs_read(
        &self,
        alloc: &str,
        file: &str,
        range: Option<(u64, u64)>,
    ) -> Result<RawBytes, Error> {
        let (what, q) = match range {
            None => ("cat", serde_urlencoded::to_string([("path", file)])),
            Some((offset, limit)) => (
                "readat",
                serde_urlencoded::to_string([
                    ("path", file.to_owned()),
                    ("offset", offset.to_string()),
                    ("limit", limit.to_string()),
                ]),
            ),
        };
        let q = q.map_err(|e| Error::InvalidRequest(format!("cannot encode the query: {e}")))?;
        let path = path(&["v1", "client", "fs", what, alloc])?;
        let (request, resp) = self.get_streaming(&path, q).await?;
        Ok(RawBytes {
            request,
            body: resp.into_body(),
        })
    }

    /// `GET /v1/client/fs/stream/{alloc}?path=P`: a file of the allocation's directory
    /// as Nomad's frames, from `offset` bytes after its start (or before its end with
    /// `from_end`), following it as it grows when `follow`.
    pub async fn alloc_fs_stream(
        &self,
        alloc: &str,
        file: &str,
        offset: u64,
        from_end: bool,
        follow: bool,
    ) -> Result<AllocLogFrames, Error> {
        let q = serde_urlencoded::to_string([
            ("path", file.to_owned()),
            ("offset", offset.to_string()),
            ("origin", if from_end { "end" } else { "start" }.to_owned()),
            ("follow", follow.to_string()),
        ])
        .map_err(|e| Error::InvalidRequest(format!("cannot encode the query: {e}")))?;
        let path = path(&["v1", "client", "fs", "stream", alloc])?;
        let (request, resp) = self.get_streaming(&path, q).await?;
        Ok(AllocLogFrames {
            request,
            body: resp.into_body(),
            buf: Vec::new(),
            done: false,
        })
    }

    /// `GET /v1/client/allocation/{alloc}/exec` (a WebSocket of
    /// [`crate::exec::ExecFrame`]s): run `command` in task `task` of the allocation
    /// interactively, on a terminal with `tty`. The agent of the allocation's node
    /// answers (through a server with a local agent).
    pub async fn alloc_exec(
        &self,
        alloc: &str,
        task: &str,
        command: &[String],
        tty: bool,
    ) -> Result<ExecSocket, Error> {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
        let command = serde_json::to_string(command)
            .map_err(|e| Error::InvalidRequest(format!("cannot encode the command: {e}")))?;
        let q = serde_urlencoded::to_string([
            ("task", task),
            ("command", command.as_str()),
            ("tty", if tty { "true" } else { "false" }),
        ])
        .map_err(|e| Error::InvalidRequest(format!("cannot encode the query: {e}")))?;
        let path = path(&["v1", "client", "allocation", alloc, "exec"])?;
        let host = match &self.target {
            Target::Tcp { host, port, .. } => format!("{host}:{port}"),
            Target::Unix(_) => "localhost".to_owned(),
        };
        let request_name = format!("GET {path}");
        let mut request = format!("ws://{host}{path}?{q}")
            .into_client_request()
            .map_err(|e| Error::InvalidRequest(e.to_string()))?;
        if let Some(token) = &self.token {
            request.headers_mut().insert(TOKEN_HEADER, token.clone());
        }
        let io = self.connect().await?;
        match tokio_tungstenite::client_async(request, io).await {
            Ok((socket, _)) => Ok(socket),
            Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
                let status = resp.status();
                let body = resp.into_body().unwrap_or_default();
                Err(refusal(&request_name, status, &body))
            }
            Err(e) => Err(Error::Request {
                address: self.address.clone(),
                reason: e.to_string(),
            }),
        }
    }

    /// Any request, answered whatever its status: for tests of the server's own
    /// checks (tokens, bodies, routes). `path_and_query` is sent as given.
    pub async fn raw(
        &self,
        method: Method,
        path_and_query: &str,
        body: Option<Vec<u8>>,
    ) -> Result<RawAnswer, Error> {
        let (path, query) = match path_and_query.split_once('?') {
            Some((p, q)) => (p.to_owned(), Some(q.to_owned())),
            None => (path_and_query.to_owned(), None),
        };
        let request = format!("{method} {path}");
        let resp = self.send(method, &path, query, body).await?;
        let status = resp.status();
        let index = index_of(resp.headers());
        let body = read_body(&request, resp.into_body()).await?;
        Ok(RawAnswer {
            status,
            index,
            body: body.to_vec(),
        })
    }

    // --- plumbing -------------------------------------------------------------------

    /// `GET path?q` whose answer is read as it comes (a log, a file): the request's
    /// name (for errors) and the answer, or the refusal a non-200 answer says.
    async fn get_streaming(
        &self,
        path: &str,
        q: String,
    ) -> Result<(String, hyper::Response<Incoming>), Error> {
        let request = format!("GET {path}");
        let resp = self.send(Method::GET, path, Some(q), None).await?;
        let status = resp.status();
        if status != StatusCode::OK {
            let body = read_body(&request, resp.into_body()).await?;
            return Err(refusal(&request, status, &body));
        }
        Ok((request, resp))
    }

    async fn read<T: DeserializeOwned>(
        &self,
        segments: &[&str],
        q: &QueryOptions,
    ) -> Result<Answer<T>, Error> {
        let path = path(segments)?;
        let request = format!("GET {path}");
        let resp = self.send(Method::GET, &path, q.query(), None).await?;
        let status = resp.status();
        let index = index_of(resp.headers()).unwrap_or(0);
        let body = read_body(&request, resp.into_body()).await?;
        if status != StatusCode::OK {
            return Err(refusal(&request, status, &body));
        }
        let value =
            serde_json::from_slice(&body).map_err(|source| Error::Decode { request, source })?;
        Ok(Answer { value, index })
    }

    async fn write<B: Serialize, R: DeserializeOwned>(
        &self,
        method: Method,
        segments: &[&str],
        query: Option<String>,
        body: Option<&B>,
    ) -> Result<R, Error> {
        let path = path(segments)?;
        let request = format!("{method} {path}");
        let body = body
            .map(serde_json::to_vec)
            .transpose()
            .map_err(|e| Error::InvalidRequest(format!("cannot encode the request body: {e}")))?;
        let resp = self.send(method, &path, query, body).await?;
        let status = resp.status();
        let body = read_body(&request, resp.into_body()).await?;
        if !status.is_success() {
            return Err(refusal(&request, status, &body));
        }
        serde_json::from_slice(&body).map_err(|source| Error::Decode { request, source })
    }

    async fn connect(&self) -> Result<Box<dyn Io>, Error> {
        let connect_err = |reason: String| Error::Connect {
            address: self.address.clone(),
            reason,
        };
        let connecting = async {
            match &self.target {
                Target::Unix(path) => tokio::net::UnixStream::connect(path)
                    .await
                    .map(|s| Box::new(s) as Box<dyn Io>)
                    .map_err(|e| connect_err(e.to_string())),
                Target::Tcp { host, port, tls } => {
                    let tcp = tokio::net::TcpStream::connect((host.as_str(), *port))
                        .await
                        .map_err(|e| connect_err(e.to_string()))?;
                    let _ = tcp.set_nodelay(true);
                    match tls {
                        None => Ok(Box::new(tcp) as Box<dyn Io>),
                        Some((connector, name)) => connector
                            .connect(name.clone(), tcp)
                            .await
                            .map(|s| Box::new(s) as Box<dyn Io>)
                            .map_err(|e| connect_err(format!("TLS: {e}"))),
                    }
                }
            }
        };
        tokio::time::timeout(CONNECT_TIMEOUT, connecting)
            .await
            .map_err(|_| connect_err(format!("no connection within {CONNECT_TIMEOUT:?}")))?
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        query: Option<String>,
        body: Option<Vec<u8>>,
    ) -> Result<hyper::Response<Incoming>, Error> {
        let io = self.connect().await?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(io))
                .await
                .map_err(|e| Error::Connect {
                    address: self.address.clone(),
                    reason: e.to_string(),
                })?;
        // Drives the connection until the answer (a log stream too) is read.
        tokio::spawn(async move {
            let _ = conn.await;
        });
        // The client's namespace, unless the request names its own.
        let names_its_own = query.as_deref().is_some_and(|q| {
            q.split('&')
                .any(|kv| kv == "namespace" || kv.starts_with("namespace="))
        });
        let query = match (&self.namespace, query) {
            (Some(ns), q) if !names_its_own => {
                let ns = format!("namespace={}", encode_query(ns));
                Some(match q {
                    Some(q) if !q.is_empty() => format!("{q}&{ns}"),
                    _ => ns,
                })
            }
            (_, q) => q,
        };
        let path_and_query = match query {
            Some(q) => format!("{path}?{q}"),
            None => path.to_owned(),
        };
        let host = match &self.target {
            Target::Tcp { host, port, .. } => format!("{host}:{port}"),
            Target::Unix(_) => "localhost".to_owned(),
        };
        let mut request = Request::builder()
            .method(method)
            .uri(path_and_query)
            .header(header::HOST, host);
        if let Some(token) = &self.token {
            request = request.header(TOKEN_HEADER, token.clone());
        }
        if body.is_some() {
            request = request.header(header::CONTENT_TYPE, "application/json");
        }
        let request = request
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| Error::InvalidRequest(e.to_string()))?;
        sender
            .send_request(request)
            .await
            .map_err(|e| Error::Request {
                address: self.address.clone(),
                reason: e.to_string(),
            })
    }
}

fn deployment_update(r: &nomad::DeploymentUpdateResponse) -> DeploymentUpdateResponse {
    DeploymentUpdateResponse {
        eval_id: r.eval_id.clone(),
        deployment_modify_index: r.deployment_modify_index,
        reverted_job_version: r.reverted_job_version,
        index: r.index,
    }
}

/// A submitted job goes to its own namespace, as `nomad job run` sends it: the job
/// file's wins over the client's `-namespace`.
fn job_namespace(job: &nomad::Job) -> Option<String> {
    job.namespace
        .as_deref()
        .filter(|ns| !ns.is_empty())
        .map(|ns| format!("namespace={}", encode_query(ns)))
}

/// `s` percent-encoded for a query value.
fn encode_query(s: &str) -> String {
    serde_urlencoded::to_string([("", s)])
        .map(|kv| kv.trim_start_matches('=').to_owned())
        .unwrap_or_default()
}

fn index_of(headers: &hyper::HeaderMap) -> Option<Index> {
    headers
        .get(INDEX_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

fn path(segments: &[&str]) -> Result<String, Error> {
    let mut out = String::new();
    for s in segments {
        if s.is_empty() {
            return Err(Error::InvalidRequest(format!(
                "an empty name or id in {}",
                segments.join("/")
            )));
        }
        out.push('/');
        out.push_str(&encode_path_segment(s));
    }
    Ok(out)
}

fn tls_connector(
    host: &str,
    options: &ClientOptions,
) -> Result<
    (
        tokio_rustls::TlsConnector,
        rustls::pki_types::ServerName<'static>,
    ),
    Error,
> {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    let Some(ca) = &options.ca_file else {
        return Err(Error::Tls(
            "an https:// address needs the CA file the server's certificate chains to \
             (DROVER_CACERT)"
                .into(),
        ));
    };
    let pem = std::fs::read(ca)
        .map_err(|e| Error::Tls(format!("cannot read the CA file {}: {e}", ca.display())))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert =
            cert.map_err(|e| Error::Tls(format!("the CA file {} is not PEM: {e}", ca.display())))?;
        roots
            .add(cert)
            .map_err(|e| Error::Tls(format!("the CA file {}: {e}", ca.display())))?;
    }
    if roots.is_empty() {
        return Err(Error::Tls(format!(
            "the CA file {} holds no certificate",
            ca.display()
        )));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Tls(e.to_string()))?
        .with_root_certificates(roots);
    let mut config = match &options.client_cert {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let certs = std::fs::read(cert)
                .map_err(|e| Error::Tls(format!("cannot read {}: {e}", cert.display())))?;
            let certs = CertificateDer::pem_slice_iter(&certs)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| Error::Tls(format!("{} is not PEM: {e}", cert.display())))?;
            let key_pem = std::fs::read(key)
                .map_err(|e| Error::Tls(format!("cannot read {}: {e}", key.display())))?;
            let key = PrivateKeyDer::from_pem_slice(&key_pem)
                .map_err(|e| Error::Tls(format!("{} holds no private key: {e}", key.display())))?;
            builder
                .with_client_auth_cert(certs, key)
                .map_err(|e| Error::Tls(e.to_string()))?
        }
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let name = ServerName::try_from(host.to_owned())
        .map_err(|e| Error::Tls(format!("{host:?} cannot be a TLS server name: {e}")))?;
    Ok((tokio_rustls::TlsConnector::from(Arc::new(config)), name))
}

async fn read_body(request: &str, body: Incoming) -> Result<Bytes, Error> {
    let limited = http_body_util::Limited::new(body, MAX_ANSWER_BYTES);
    limited
        .collect()
        .await
        .map(|b| b.to_bytes())
        .map_err(|e| Error::Body {
            request: request.to_owned(),
            reason: e.to_string(),
        })
}

/// The error for an error answer: the server's own words when it gave them.
fn refusal(request: &str, status: StatusCode, body: &[u8]) -> Error {
    let from_body = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_owned));
    let message = match from_body {
        Some(m) => m,
        None => {
            let text = String::from_utf8_lossy(body).trim().to_owned();
            if text.is_empty() {
                format!("{request}: {status}")
            } else {
                format!("{request}: {status}: {text}")
            }
        }
    };
    Error::Status { status, message }
}

/// The bytes of a file of an allocation, as they arrive ([`Client::alloc_fs_read`]).
#[derive(Debug)]
pub struct RawBytes {
    request: String,
    body: Incoming,
}

impl RawBytes {
    /// The next piece of the file; `Ok(None)` at its end.
    pub async fn next(&mut self) -> Result<Option<Vec<u8>>, Error> {
        loop {
            match self.body.frame().await {
                None => return Ok(None),
                Some(Err(e)) => {
                    return Err(Error::Body {
                        request: self.request.clone(),
                        reason: e.to_string(),
                    });
                }
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data()
                        && !data.is_empty()
                    {
                        return Ok(Some(data.to_vec()));
                    }
                }
            }
        }
    }
}

/// A task's log as it arrives, from [`Client::alloc_logs`]: Nomad's frames
/// ([`crate::client_fs::StreamFrame`]), one JSON object after the other.
#[derive(Debug)]
pub struct AllocLogFrames {
    request: String,
    body: Incoming,
    /// Received, not decoded yet.
    buf: Vec<u8>,
    done: bool,
}

/// Frames of a log stream held at most before one is whole (Nomad's frames carry at
/// most 64 KiB, base64: a third more).
const MAX_LOG_FRAME_BYTES: usize = 1024 * 1024;

impl AllocLogFrames {
    /// The next frame ([`Frame::Data`] or [`Frame::Skipped`]); `Ok(None)` at the end.
    /// Heartbeats and Nomad's file events are passed over.
    pub async fn next(&mut self) -> Result<Option<Frame>, Error> {
        use crate::client_fs::{FILE_EVENT_ERROR, FILE_EVENT_SKIPPED, StreamFrame};
        loop {
            let mut frames = serde_json::Deserializer::from_slice(&self.buf).into_iter();
            let decoded: Option<Result<StreamFrame, _>> = frames.next();
            let used = frames.byte_offset();
            let body_error = |reason: String| Error::Body {
                request: self.request.clone(),
                reason,
            };
            match decoded {
                Some(Ok(frame)) => {
                    self.buf.drain(..used);
                    if frame.file_event == FILE_EVENT_ERROR {
                        self.done = true;
                        return Err(Error::Stream(frame.error.unwrap_or_default()));
                    }
                    if frame.file_event == FILE_EVENT_SKIPPED {
                        return Ok(Some(Frame::Skipped(frame.skipped.unwrap_or(0))));
                    }
                    if !frame.data.is_empty() {
                        return Ok(Some(Frame::Data(frame.data)));
                    }
                    continue;
                }
                Some(Err(e)) if !e.is_eof() => {
                    return Err(body_error(format!("not a log frame: {e}")));
                }
                // Only whitespace, or a frame not whole yet: read on.
                _ if self.done => {
                    if self.buf.iter().all(u8::is_ascii_whitespace) {
                        return Ok(None);
                    }
                    return Err(body_error(
                        "the log stream ended in the middle of a frame".into(),
                    ));
                }
                _ if self.buf.len() > MAX_LOG_FRAME_BYTES => {
                    return Err(body_error(format!(
                        "a log frame longer than {MAX_LOG_FRAME_BYTES} bytes"
                    )));
                }
                _ => {}
            }
            match self.body.frame().await {
                None => self.done = true,
                Some(Err(e)) => {
                    return Err(Error::Body {
                        request: self.request.clone(),
                        reason: e.to_string(),
                    });
                }
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.buf.extend_from_slice(&data);
                    }
                }
            }
        }
    }
}
