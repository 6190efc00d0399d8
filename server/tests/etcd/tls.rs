//! The etcd store over TLS: an etcd that serves https and requires client
//! certificates; the store connects with the CA and its client certificate, and a
//! wrong CA or a missing client certificate fails clearly.

use std::path::{Path, PathBuf};
use std::time::Duration;

use drover_server::store::etcd::EtcdTls;
use drover_server::store::{EtcdOptions, EtcdStore, Op, Store};
use drover_test_support::etcd::{ClientTls, Etcd};
use drover_test_support::pki::TestCa;

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn options(endpoint: String, tls: Option<EtcdTls>) -> EtcdOptions {
    let mut o = EtcdOptions::new(vec![endpoint]);
    o.request_timeout = Duration::from_secs(3);
    o.tls = tls;
    o
}

#[tokio::test]
async fn the_store_talks_tls_to_an_etcd_that_checks_client_certificates() {
    let dir = tempfile::tempdir().unwrap();
    let pki = TestCa::new();
    let (scert, skey) = pki.leaf("127.0.0.1");
    let (ccert, ckey) = pki.leaf("drover-server");
    let ca_file = write(dir.path(), "ca.pem", &pki.ca_pem);
    let Some(etcd) = Etcd::start_tls(ClientTls {
        cert: write(dir.path(), "etcd.pem", &scert),
        key: write(dir.path(), "etcd-key.pem", &skey),
        client_ca: ca_file.clone(),
    }) else {
        return;
    };
    assert!(etcd.endpoint().starts_with("https://127.0.0.1:"));
    let tls = EtcdTls {
        ca: ca_file.clone(),
        cert: Some(write(dir.path(), "client.pem", &ccert)),
        key: Some(write(dir.path(), "client-key.pem", &ckey)),
        server_name: None,
    };
    let s = EtcdStore::connect(options(etcd.endpoint(), Some(tls.clone())))
        .await
        .expect("connect over TLS with a client certificate");
    let r = s
        .txn(
            vec![],
            vec![Op::Put {
                key: "job/a".into(),
                value: b"1".to_vec(),
            }],
        )
        .await
        .unwrap();
    assert_eq!((r.succeeded, r.revision), (true, 1));
    assert!(s.health().await[0].healthy);

    // No client certificate: etcd refuses the handshake.
    let mut no_cert = tls.clone();
    no_cert.cert = None;
    no_cert.key = None;
    let err = EtcdStore::connect(options(etcd.endpoint(), Some(no_cert)))
        .await
        .unwrap_err();
    // (etcd's alert or a closed connection, depending on when TLS 1.3 reports it)
    assert!(err.to_string().contains(&etcd.endpoint()), "{err}");

    // A CA that did not sign etcd's certificate: this side refuses.
    let other = TestCa::new();
    let mut wrong_ca = tls.clone();
    wrong_ca.ca = write(dir.path(), "other-ca.pem", &other.ca_pem);
    let err = EtcdStore::connect(options(etcd.endpoint(), Some(wrong_ca)))
        .await
        .unwrap_err();
    assert!(err.to_string().contains(&etcd.endpoint()), "{err}");
    assert!(
        err.to_string().to_lowercase().contains("certificate"),
        "{err}"
    );

    // Plain http to the TLS port fails too, clearly.
    let plain = etcd.endpoint().replace("https://", "http://");
    let err = EtcdStore::connect(options(plain.clone(), None))
        .await
        .unwrap_err();
    assert!(err.to_string().contains(&plain), "{err}");
}
