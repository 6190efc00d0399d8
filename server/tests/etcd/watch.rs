//! Following the state on a real etcd: a watch sees another instance's commits in
//! order, without the election's and registrations' keys, resets after a compaction,
//! survives etcd's restart; a transaction beyond etcd's limits is split into parts
//! only the last of which moves the index.

use std::time::Duration;

use drover_server::ServerInfo;
use drover_server::store::{
    EtcdOptions, EtcdStore, Op, Store, StoreChange, WatchEvent, WatchStream,
};
use drover_test_support::etcd::{Etcd, shared};
use drover_test_support::within;
use futures_util::StreamExt as _;

fn put(key: &str, value: &str) -> Op {
    Op::Put {
        key: key.into(),
        value: value.as_bytes().to_vec(),
    }
}

async fn store(endpoint: &str, prefix: &str) -> EtcdStore {
    let mut o = EtcdOptions::new(vec![endpoint.to_owned()]);
    o.prefix = prefix.to_owned();
    o.request_timeout = Duration::from_secs(2);
    EtcdStore::connect(o)
        .await
        .expect("connect to the test etcd")
}

async fn next(w: &mut WatchStream) -> WatchEvent {
    within(Duration::from_secs(10), "the next watch event", w.next())
        .await
        .expect("the watch ended")
        .expect("a watch event")
}

async fn next_change(w: &mut WatchStream) -> StoreChange {
    match next(w).await {
        WatchEvent::Change(c) => c,
        WatchEvent::Reset => panic!("unexpected Reset"),
    }
}

#[tokio::test]
async fn a_watch_sees_another_instances_commits_in_order_without_election_keys() {
    let Some(etcd) = shared() else { return };
    let prefix = etcd.unique_prefix();
    let leader = store(&etcd.endpoint(), &prefix).await;
    let follower = store(&etcd.endpoint(), &prefix).await;
    assert!(
        leader
            .txn(vec![], vec![put("job/a", "1")])
            .await
            .unwrap()
            .succeeded
    );
    let (kvs, index) = follower.range("").await.unwrap();
    assert_eq!((kvs.len(), index), (1, 1));
    let mut w = follower.watch(index);

    // Election and registration writes move etcd's revision, not the state.
    let e = leader.election();
    let me = ServerInfo {
        name: "leader".into(),
        rpc_addr: "127.0.0.1:1".into(),
        http_addr: "127.0.0.1:2".into(),
        tls: false,
        version: "test".into(),
        started: 1,
    };
    let term = e.campaign(me.clone()).await.unwrap();
    let reg = tokio::spawn({
        let e = e.clone();
        async move { e.register(me).await }
    });
    within(Duration::from_secs(5), "registered", async {
        while e.members().await.unwrap().is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;

    let r = leader
        .txn(
            term.fence.clone(),
            vec![put("job/b", "2"), put("node/n1", "up")],
        )
        .await
        .unwrap();
    assert_eq!((r.succeeded, r.revision), (true, 2));
    let r = leader
        .txn(
            term.fence.clone(),
            vec![Op::Delete {
                key: "job/a".into(),
            }],
        )
        .await
        .unwrap();
    assert_eq!((r.succeeded, r.revision), (true, 3));

    let c = next_change(&mut w).await;
    assert_eq!(c.revision, Some(2), "{c:?}");
    let keys: Vec<&str> = c.puts.iter().map(|kv| kv.key.as_str()).collect();
    assert_eq!(keys, ["job/b", "node/n1"]);
    assert_eq!(c.puts[0].value, b"2");
    assert!(c.deletes.is_empty());
    let c = next_change(&mut w).await;
    assert_eq!(c.revision, Some(3));
    assert!(c.puts.is_empty());
    assert_eq!(c.deletes, ["job/a"]);

    // The follower learnt index 3 from its watch: it could commit now (as after
    // taking over).
    let r = follower.txn(vec![], vec![put("job/c", "3")]).await.unwrap();
    assert_eq!((r.succeeded, r.revision), (true, 4));
    let c = next_change(&mut w).await;
    assert_eq!(c.revision, Some(4));
    reg.abort();
    e.close().await;
}

#[tokio::test]
async fn a_watch_from_an_unknown_or_compacted_index_resets() {
    // A private etcd: compacting the shared one would reset other tests' watches.
    let Some(etcd) = Etcd::start() else { return };
    let prefix = "/drover/".to_owned();
    let s = store(&etcd.endpoint(), &prefix).await;
    for i in 0..3 {
        assert!(
            s.txn(vec![], vec![put("job/a", &i.to_string())])
                .await
                .unwrap()
                .succeeded
        );
    }
    let other = store(&etcd.endpoint(), &prefix).await;
    // `other` never saw index 1.
    assert_eq!(next(&mut other.watch(1)).await, WatchEvent::Reset);

    let (_, index) = other.range("").await.unwrap();
    assert_eq!(index, 3);
    for i in 0..3 {
        assert!(
            s.txn(vec![], vec![put("job/a", &format!("later {i}"))])
                .await
                .unwrap()
                .succeeded
        );
    }
    compact_all(&etcd.endpoint()).await;
    let mut w = other.watch(index);
    assert_eq!(
        next(&mut w).await,
        WatchEvent::Reset,
        "index 3 is compacted away"
    );
    assert!(
        within(Duration::from_secs(5), "the end of the watch", w.next())
            .await
            .is_none(),
        "the stream ends after Reset"
    );
    // Read again, watch again: it goes on.
    let (kvs, index) = other.range("").await.unwrap();
    assert_eq!((index, kvs[0].value.as_slice()), (6, &b"later 2"[..]));
    let mut w = other.watch(index);
    assert!(
        s.txn(vec![], vec![put("job/z", "z")])
            .await
            .unwrap()
            .succeeded
    );
    assert_eq!(next_change(&mut w).await.revision, Some(7));
}

#[tokio::test]
async fn a_transaction_beyond_etcds_limits_is_split_and_only_its_last_part_moves_the_index() {
    let Some(etcd) = shared() else { return };
    let prefix = etcd.unique_prefix();
    let s = store(&etcd.endpoint(), &prefix).await;
    let follower = store(&etcd.endpoint(), &prefix).await;
    let (_, index) = follower.range("").await.unwrap();
    let mut w = follower.watch(index);
    // 1000 ops of 2 KiB: beyond etcd's 128 ops and 1.5 MiB per request.
    let value = "v".repeat(2048);
    let ops: Vec<Op> = (0..1000)
        .map(|i| put(&format!("alloc/{i:04}"), &value))
        .collect();
    let r = s.txn(vec![], ops).await.unwrap();
    assert_eq!(
        (r.succeeded, r.revision),
        (true, 1),
        "one commit, one index"
    );
    let (kvs, rev) = s.range("alloc/").await.unwrap();
    assert_eq!((kvs.len(), rev), (1000, 1));

    let mut seen = 0;
    let mut parts = 0;
    loop {
        let c = next_change(&mut w).await;
        parts += 1;
        seen += c.puts.len();
        if let Some(r) = c.revision {
            assert_eq!(r, 1);
            break;
        }
    }
    assert_eq!(seen, 1000);
    assert!(
        parts >= 8,
        "1000 ops in parts of at most 127: {parts} parts"
    );

    // One value beyond a request is refused up front, naming the key.
    let huge = "x".repeat(2 * 1024 * 1024);
    let err = s
        .txn(vec![], vec![put("job/huge", &huge)])
        .await
        .unwrap_err();
    assert!(
        matches!(err, drover_server::store::StoreError::TooLarge(_)),
        "{err}"
    );
    assert!(err.to_string().contains("job/huge"), "{err}");
    assert_eq!(s.revision().await.unwrap(), 1);
}

#[tokio::test]
async fn the_store_and_its_watch_carry_on_after_etcd_is_killed_and_started_again() {
    let Some(mut etcd) = Etcd::start() else {
        return;
    };
    let prefix = "/drover/";
    let leader = store(&etcd.endpoint(), prefix).await;
    let follower = store(&etcd.endpoint(), prefix).await;
    assert!(
        leader
            .txn(vec![], vec![put("job/a", "1")])
            .await
            .unwrap()
            .succeeded
    );
    let (_, index) = follower.range("").await.unwrap();
    let mut w = follower.watch(index);
    assert!(
        leader
            .txn(vec![], vec![put("job/b", "2")])
            .await
            .unwrap()
            .succeeded
    );
    assert_eq!(next_change(&mut w).await.revision, Some(2));

    etcd.kill9();
    let err = leader
        .txn(vec![], vec![put("job/c", "3")])
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains(&etcd.endpoint()),
        "names the endpoint: {err}"
    );
    assert!(
        follower.range("").await.is_err(),
        "reads fail clearly while etcd is down"
    );
    let health = leader.health().await;
    assert!(
        !health[0].healthy && health[0].error.is_some(),
        "{health:?}"
    );

    etcd.start_again();
    // The first calls after the restart may meet the reconnecting channel.
    let r = within(
        Duration::from_secs(20),
        "a commit after etcd came back",
        async {
            loop {
                match leader.txn(vec![], vec![put("job/c", "3")]).await {
                    Ok(r) => break r,
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        },
    )
    .await;
    assert_eq!((r.succeeded, r.revision), (true, 3));
    let c = next_change(&mut w).await;
    assert_eq!(c.revision, Some(3), "the watch resumed where it was: {c:?}");
    assert_eq!(c.puts[0].key, "job/c");
    assert!(leader.health().await[0].healthy);
}

/// Compact etcd's whole history, as `etcdctl compact` does.
async fn compact_all(endpoint: &str) {
    use drover_proto::etcd::etcdserverpb::{CompactionRequest, RangeRequest, kv_client::KvClient};
    let mut c = KvClient::connect(endpoint.to_owned()).await.unwrap();
    let rev = c
        .range(RangeRequest {
            key: b"/".to_vec(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .header
        .unwrap()
        .revision;
    c.compact(CompactionRequest {
        revision: rev,
        physical: true,
    })
    .await
    .unwrap();
}
