//! The HTTP listener: TLS (rustls, checked before anything is served), a bound on
//! open connections, header and handshake timeouts, and a graceful shutdown.

use std::sync::Arc;
use std::time::Duration;

use axum::{Extension, Router};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::error::ServerError;

/// Connections served at once; more wait in the listen backlog. Blocking queries hold a
/// connection for up to [`MAX_BLOCKING_WAIT`], so this is generous, but bounded.
const MAX_CONNECTIONS: usize = 4096;
/// A connection must send a whole request head within this (after accept, and after
/// each answer on a kept-alive one), or it is closed: idle sockets cannot hold slots.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// A TLS handshake must finish within this.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// After shutdown fires, requests in flight get this long to finish.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// The rustls server config for `files`: their certificate chain and key, and with a
/// client CA, client certificates required (mutual TLS). Errors name the file.
pub fn tls_server_config(
    files: &crate::transport::tls::TlsFiles,
) -> Result<rustls::ServerConfig, ServerError> {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let read = |path: &std::path::Path, what: &str| {
        std::fs::read(path).map_err(|e| {
            ServerError::Invalid(format!(
                "cannot read the TLS {what} {}: {e}",
                path.display()
            ))
        })
    };
    let pem_certs = |path: &std::path::Path,
                     what: &str|
     -> Result<Vec<CertificateDer<'static>>, ServerError> {
        let pem = read(path, what)?;
        let certs = CertificateDer::pem_slice_iter(&pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| {
                ServerError::Invalid(format!("the TLS {what} {} is not PEM: {e}", path.display()))
            })?;
        if certs.is_empty() {
            return Err(ServerError::Invalid(format!(
                "the TLS {what} {} holds no certificate",
                path.display()
            )));
        }
        Ok(certs)
    };
    let certs = pem_certs(&files.cert, "certificate file")?;
    let key_pem = read(&files.key, "key file")?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
        ServerError::Invalid(format!(
            "the TLS key file {} holds no private key: {e}",
            files.key.display()
        ))
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| ServerError::Invalid(format!("TLS: {e}")))?;
    let builder = match &files.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in pem_certs(ca, "client CA file")? {
                roots.add(cert).map_err(|e| {
                    ServerError::Invalid(format!("the TLS client CA file {}: {e}", ca.display()))
                })?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .map_err(|e| {
                ServerError::Invalid(format!("the TLS client CA file {}: {e}", ca.display()))
            })?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_single_cert(certs, key).map_err(|e| {
        ServerError::Invalid(format!(
            "the TLS certificate {} and key {} do not make a usable pair: {e}",
            files.cert.display(),
            files.key.display()
        ))
    })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// Serve `router` on `listener` (TLS when `tls` is set) until `shutdown` fires; then
/// stop accepting, end blocking queries with what there is, and give requests in
/// flight `SHUTDOWN_GRACE` to finish. A bad TLS file is an error before anything is
/// served.
pub async fn serve(
    router: axum::Router,
    listener: TcpListener,
    tls: Option<crate::transport::tls::TlsFiles>,
    shutdown: CancellationToken,
) -> Result<(), ServerError> {
    let acceptor = match &tls {
        Some(files) => Some(tokio_rustls::TlsAcceptor::from(Arc::new(
            tls_server_config(files)?,
        ))),
        None => None,
    };
    let app = router.layer(Extension(shutdown.clone()));
    // Not `axum::serve`: it builds hyper's connection without a timer, and without one
    // hyper never enforces `header_read_timeout`.
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    // Each connection's task holds a clone of `open`; once all are dropped, `drained`
    // reports that every connection closed.
    let (open, mut drained) = tokio::sync::mpsc::channel::<()>(1);
    loop {
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
            () = shutdown.cancelled() => break,
        };
        let (stream, peer) = tokio::select! {
            conn = listener.accept() => match conn {
                Ok(c) => c,
                Err(e) => {
                    // Out of descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "HTTP accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = shutdown.cancelled() => break,
        };
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        let http = http.clone();
        let acceptor = acceptor.clone();
        let stop = shutdown.clone();
        let open = open.clone();
        tokio::spawn(async move {
            let _open = open;
            let _permit = permit;
            match acceptor {
                None => serve_connection(&http, stream, app, &stop).await,
                Some(acceptor) => {
                    let tls =
                        tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await;
                    match tls {
                        Ok(Ok(tls)) => serve_connection(&http, tls, app, &stop).await,
                        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                }
            }
        });
    }
    drop(listener);
    drop(open);
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, drained.recv()).await;
    Ok(())
}

async fn serve_connection<IO>(
    http: &hyper::server::conn::http1::Builder,
    io: IO,
    app: Router,
    stop: &CancellationToken,
) where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper_util::service::TowerToHyperService::new(app);
    // With upgrades: `alloc exec` is a WebSocket.
    let conn = http
        .serve_connection(hyper_util::rt::TokioIo::new(io), service)
        .with_upgrades();
    let mut conn = std::pin::pin!(conn);
    let done = tokio::select! {
        r = conn.as_mut() => Some(r),
        () = stop.cancelled() => None,
    };
    let r = match done {
        Some(r) => r,
        None => {
            // Finish the request in flight, if any, then close.
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = r {
        tracing::debug!(error = %e, "HTTP connection ended with an error");
    }
}
