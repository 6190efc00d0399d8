//! The etcd store on a real etcd: the same range/txn/revision semantics as the embedded
//! store (standalone/store.rs), plus what only several servers on one etcd have:
//! a second writer that did not read the last commit is refused, prefixes isolate,
//! the schema is checked.

use std::time::Duration;

use drover_server::store::{Condition, EtcdOptions, EtcdStore, Op, Store, StoreError};
use drover_test_support::etcd::{SharedEtcd, shared};

fn put(key: &str, value: &str) -> Op {
    Op::Put {
        key: key.into(),
        value: value.as_bytes().to_vec(),
    }
}

fn options(endpoint: &str, prefix: &str) -> EtcdOptions {
    let mut o = EtcdOptions::new(vec![endpoint.to_owned()]);
    o.prefix = prefix.to_owned();
    o.request_timeout = Duration::from_secs(3);
    o
}

async fn store(etcd: &SharedEtcd, prefix: &str) -> EtcdStore {
    EtcdStore::connect(options(&etcd.endpoint(), prefix))
        .await
        .expect("connect to the test etcd")
}

#[tokio::test]
async fn revisions_grow_per_transaction_and_survive_a_reconnect() {
    let Some(etcd) = shared() else { return };
    let prefix = etcd.unique_prefix();
    {
        let s = store(&etcd, &prefix).await;
        assert_eq!(s.revision().await.unwrap(), 0);
        let (kvs, rev) = s.range("").await.unwrap();
        assert!(kvs.is_empty(), "{kvs:?}");
        assert_eq!(rev, 0);
        let r = s
            .txn(vec![], vec![put("job/a", "1"), put("job/b", "2")])
            .await
            .unwrap();
        assert!(r.succeeded);
        assert_eq!(r.revision, 1, "one transaction, one revision");
        let r = s.txn(vec![], vec![put("job/a", "3")]).await.unwrap();
        assert!(r.succeeded);
        assert_eq!(r.revision, 2);
    }
    let s = store(&etcd, &prefix).await;
    assert_eq!(s.revision().await.unwrap(), 2);
    let (kvs, rev) = s.range("job/").await.unwrap();
    assert_eq!(rev, 2);
    assert_eq!(kvs.len(), 2);
    assert_eq!(kvs[0].key, "job/a");
    assert_eq!(kvs[0].value, b"3");
    assert_eq!(kvs[1].key, "job/b");
    // etcd's revisions: job/a was written twice, job/b once, by the same first txn.
    assert_eq!(kvs[0].create_revision, kvs[1].create_revision);
    assert_eq!(kvs[1].mod_revision, kvs[1].create_revision);
    assert!(kvs[0].mod_revision > kvs[0].create_revision);
}

#[tokio::test]
async fn range_returns_only_the_prefix_in_key_order_and_never_the_stores_own_keys() {
    let Some(etcd) = shared() else { return };
    let s = store(&etcd, &etcd.unique_prefix()).await;
    let r = s
        .txn(
            vec![],
            vec![
                put("node/2", "x"),
                put("node/1", "x"),
                put("nodes", "x"),
                put("job/n", "x"),
                put("alloc/1", "x"),
            ],
        )
        .await
        .unwrap();
    assert!(r.succeeded);
    // Registration and election keys live under the prefix too.
    let election = s.election();
    let me = drover_server::ServerInfo {
        name: "s1".into(),
        rpc_addr: "127.0.0.1:1".into(),
        http_addr: "127.0.0.1:2".into(),
        tls: false,
        version: "test".into(),
        started: 0,
    };
    let _term = election.campaign(me.clone()).await.unwrap();
    let reg = tokio::spawn({
        let e = election.clone();
        async move { e.register(me).await }
    });
    drover_test_support::within(Duration::from_secs(10), "the registration", async {
        while election.members().await.unwrap().is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let (kvs, _) = s.range("node/").await.unwrap();
    let keys: Vec<&str> = kvs.iter().map(|k| k.key.as_str()).collect();
    assert_eq!(keys, ["node/1", "node/2"]);
    let (all, rev) = s.range("").await.unwrap();
    let keys: Vec<&str> = all.iter().map(|k| k.key.as_str()).collect();
    assert_eq!(keys, ["alloc/1", "job/n", "node/1", "node/2", "nodes"]);
    assert_eq!(rev, 1);
    reg.abort();
    election.close().await;
}

#[tokio::test]
async fn a_range_larger_than_a_page_is_one_snapshot() {
    let Some(etcd) = shared() else { return };
    let s = store(&etcd, &etcd.unique_prefix()).await;
    // 1200 keys: three pages of 500, in transactions of etcd's 128 ops.
    for chunk in 0..12 {
        let ops = (0..100)
            .map(|i| put(&format!("alloc/{:05}", chunk * 100 + i), "v"))
            .collect();
        assert!(s.txn(vec![], ops).await.unwrap().succeeded);
    }
    let (kvs, rev) = s.range("alloc/").await.unwrap();
    assert_eq!(rev, 12);
    assert_eq!(kvs.len(), 1200);
    assert!(kvs.windows(2).all(|w| w[0].key < w[1].key), "key order");
}

#[tokio::test]
async fn conditions_compare_and_set_and_a_failed_txn_writes_nothing() {
    let Some(etcd) = shared() else { return };
    let s = store(&etcd, &etcd.unique_prefix()).await;
    let absent = |k: &str| Condition::ModRevision {
        key: k.into(),
        revision: 0,
    };
    let r = s
        .txn(vec![absent("lock")], vec![put("lock", "me")])
        .await
        .unwrap();
    assert!(r.succeeded);
    assert_eq!(r.revision, 1);
    let r = s
        .txn(
            vec![absent("lock")],
            vec![put("lock", "you"), put("other", "x")],
        )
        .await
        .unwrap();
    assert!(!r.succeeded, "the key exists now");
    assert_eq!(
        r.revision, 1,
        "a failed transaction does not move the revision"
    );
    let (kvs, _) = s.range("").await.unwrap();
    assert_eq!(
        kvs.len(),
        1,
        "nothing of the failed transaction was written"
    );
    assert_eq!(kvs[0].value, b"me");
    let lock_rev = kvs[0].mod_revision;

    let r = s
        .txn(
            vec![Condition::ModRevision {
                key: "lock".into(),
                revision: lock_rev,
            }],
            vec![put("lock", "me2")],
        )
        .await
        .unwrap();
    assert!(r.succeeded);
    assert_eq!(r.revision, 2);
    let stale = s
        .txn(
            vec![Condition::ModRevision {
                key: "lock".into(),
                revision: lock_rev,
            }],
            vec![put("lock", "late")],
        )
        .await
        .unwrap();
    assert!(!stale.succeeded, "mod revision moved");
    assert_eq!(stale.revision, 2);
    let fenced = s
        .txn(
            vec![Condition::CreateRevision {
                key: "lock".into(),
                revision: lock_rev,
            }],
            vec![Op::Delete { key: "lock".into() }],
        )
        .await
        .unwrap();
    assert!(fenced.succeeded, "create revision is unchanged");
    let (kvs, rev) = s.range("").await.unwrap();
    assert!(kvs.is_empty());
    assert_eq!(rev, 3);
    assert_eq!(s.revision().await.unwrap(), 3);
}

#[tokio::test]
async fn the_last_write_of_a_key_wins_within_one_transaction() {
    let Some(etcd) = shared() else { return };
    let s = store(&etcd, &etcd.unique_prefix()).await;
    let r = s
        .txn(
            vec![],
            vec![
                put("eval/1", "a"),
                put("eval/2", "x"),
                put("eval/1", "b"),
                Op::Delete {
                    key: "eval/2".into(),
                },
            ],
        )
        .await
        .unwrap();
    assert!(r.succeeded);
    let (kvs, _) = s.range("eval/").await.unwrap();
    assert_eq!(kvs.len(), 1);
    assert_eq!(
        (kvs[0].key.as_str(), kvs[0].value.as_slice()),
        ("eval/1", &b"b"[..])
    );
}

#[tokio::test]
async fn a_second_writer_that_did_not_read_the_last_commit_is_refused() {
    let Some(etcd) = shared() else { return };
    let prefix = etcd.unique_prefix();
    let a = store(&etcd, &prefix).await;
    let b = store(&etcd, &prefix).await;
    a.range("").await.unwrap();
    b.range("").await.unwrap();
    let r = a.txn(vec![], vec![put("job/x", "from a")]).await.unwrap();
    assert!(r.succeeded);
    assert_eq!(r.revision, 1);
    let r = b.txn(vec![], vec![put("job/x", "from b")]).await.unwrap();
    assert!(!r.succeeded, "b has not seen a's commit");
    assert_eq!(r.revision, 1, "the current index");
    // A failed commit teaches nothing: b stays refused until it reads again.
    let r = b.txn(vec![], vec![put("job/x", "from b")]).await.unwrap();
    assert!(!r.succeeded);
    let (kvs, rev) = b.range("").await.unwrap();
    assert_eq!(rev, 1);
    assert_eq!(kvs[0].value, b"from a");
    let r = b.txn(vec![], vec![put("job/x", "from b")]).await.unwrap();
    assert!(r.succeeded, "after reading, b commits");
    assert_eq!(r.revision, 2);
    let r = a.txn(vec![], vec![put("job/y", "a again")]).await.unwrap();
    assert!(!r.succeeded, "now a is behind");
    assert_eq!(a.revision().await.unwrap(), 2);
}

#[tokio::test]
async fn prefixes_isolate_clusters_sharing_one_etcd() {
    let Some(etcd) = shared() else { return };
    let one = store(&etcd, &etcd.unique_prefix()).await;
    let two = store(&etcd, &etcd.unique_prefix()).await;
    assert!(
        one.txn(vec![], vec![put("job/a", "1")])
            .await
            .unwrap()
            .succeeded
    );
    assert!(
        one.txn(vec![], vec![put("job/b", "1")])
            .await
            .unwrap()
            .succeeded
    );
    assert_eq!(two.revision().await.unwrap(), 0);
    assert!(two.range("").await.unwrap().0.is_empty());
    let r = two.txn(vec![], vec![put("job/a", "2")]).await.unwrap();
    assert_eq!((r.succeeded, r.revision), (true, 1));
    assert_eq!(one.range("job/").await.unwrap().0[0].value, b"1");
}

#[tokio::test]
async fn another_schema_under_the_prefix_is_refused_clearly() {
    let Some(etcd) = shared() else { return };
    let prefix = etcd.unique_prefix();
    // Write schema "2" the way a future server would.
    let s = store(&etcd, &prefix).await;
    drop(s);
    let raw = raw_put(&etcd.endpoint(), &format!("{prefix}schema"), "2").await;
    assert!(raw, "raw put");
    let err = EtcdStore::connect(options(&etcd.endpoint(), &prefix))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Corrupt(_)), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("schema \"2\"") && text.contains(&prefix),
        "{text}"
    );
}

#[tokio::test]
async fn bad_options_and_a_dead_endpoint_fail_clearly() {
    let mut o = options("http://127.0.0.1:1", "/x/");
    o.request_timeout = Duration::from_secs(1);
    let err = EtcdStore::connect(o).await.unwrap_err();
    let text = err.to_string();
    assert!(text.contains("127.0.0.1:1"), "names the endpoint: {text}");
    let err = EtcdStore::connect(options("http://127.0.0.1:1", "no-slash"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("must end with '/'"), "{err}");
    let err = EtcdStore::connect(options("127.0.0.1:2379", "/x/"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("http://"), "{err}");
}

#[tokio::test]
async fn a_second_endpoint_serves_when_the_first_is_down() {
    let Some(etcd) = shared() else { return };
    let mut o = options("http://127.0.0.1:1", &etcd.unique_prefix());
    o.endpoints.push(etcd.endpoint());
    let s = EtcdStore::connect(o)
        .await
        .expect("fails over to the live endpoint");
    assert!(
        s.txn(vec![], vec![put("job/a", "1")])
            .await
            .unwrap()
            .succeeded
    );
    assert_eq!(s.revision().await.unwrap(), 1);
    let health = s.health().await;
    assert_eq!(health.len(), 2);
    assert!(!health[0].healthy);
    assert!(health[0].error.is_some(), "{:?}", health[0]);
    assert!(health[1].healthy, "{:?}", health[1]);
    assert!(
        health[1]
            .version
            .as_deref()
            .is_some_and(|v| v.starts_with('3'))
    );
    assert!(health[1].is_leader, "a one-member etcd leads itself");
    assert!(health[1].db_size.is_some_and(|n| n > 0));
}

/// A put outside the store, through etcd's API, as another program would.
async fn raw_put(endpoint: &str, key: &str, value: &str) -> bool {
    use drover_proto::etcd::etcdserverpb::{PutRequest, kv_client::KvClient};
    let mut c = KvClient::connect(endpoint.to_owned()).await.unwrap();
    c.put(PutRequest {
        key: key.as_bytes().to_vec(),
        value: value.as_bytes().to_vec(),
        lease: 0,
    })
    .await
    .is_ok()
}

#[tokio::test]
async fn a_prefix_nested_in_or_around_another_clusters_prefix_is_refused() {
    let Some(etcd) = shared() else { return };
    let outer = etcd.unique_prefix();
    let inner = format!("{outer}inner/");
    // A cluster at `outer`: a prefix inside it is refused.
    let first = store(&etcd, &outer).await;
    let Err(err) = EtcdStore::connect(options(&etcd.endpoint(), &inner)).await else {
        panic!("a prefix inside another cluster's is refused");
    };
    let msg = err.to_string();
    assert!(
        msg.contains("must not nest") && msg.contains(&outer),
        "{msg}"
    );
    drop(first);

    // A cluster at `below`: a new prefix around it is refused.
    let around = etcd.unique_prefix();
    let below = format!("{around}b/");
    let _second = store(&etcd, &below).await;
    let Err(err) = EtcdStore::connect(options(&etcd.endpoint(), &around)).await else {
        panic!("a prefix around another cluster's is refused");
    };
    let msg = err.to_string();
    assert!(msg.contains("must not nest"), "{msg}");

    // Side by side is fine, and so is connecting again to one's own prefix.
    let _third = store(&etcd, &etcd.unique_prefix()).await;
    let _again = store(&etcd, &below).await;
}
