//! The etcd store on a three-member etcd cluster: when the member a server talks to
//! dies, its commits, its watch and its leadership carry on through the others.

use std::time::Duration;

use drover_server::ServerInfo;
use drover_server::store::{EtcdOptions, EtcdStore, Op, Store, WatchEvent};
use drover_test_support::etcd::EtcdCluster;
use drover_test_support::within;
use futures_util::StreamExt as _;

fn put(key: &str, value: &str) -> Op {
    Op::Put {
        key: key.into(),
        value: value.as_bytes().to_vec(),
    }
}

#[tokio::test]
async fn commits_watch_and_leadership_survive_the_loss_of_the_member_in_use() {
    let Some(mut cluster) = EtcdCluster::start(3) else {
        return;
    };
    let connect = || {
        let mut o = EtcdOptions::new(cluster.endpoints());
        o.lease_ttl = Duration::from_secs(6);
        EtcdStore::connect(o)
    };
    let leader = connect().await.unwrap();
    let follower = connect().await.unwrap();
    let me = ServerInfo {
        name: "a".into(),
        rpc_addr: "127.0.0.1:1".into(),
        http_addr: "127.0.0.1:2".into(),
        tls: false,
        version: "test".into(),
        started: 1,
    };
    let term = within(
        Duration::from_secs(10),
        "campaign",
        leader.election().campaign(me),
    )
    .await
    .unwrap();
    leader.range("").await.unwrap();
    let r = leader
        .txn(term.fence.clone(), vec![put("job/a", "1")])
        .await
        .unwrap();
    assert_eq!((r.succeeded, r.revision), (true, 1));
    let (_, index) = follower.range("").await.unwrap();
    let mut w = follower.watch(index);

    // Both talk to the first member: kill it.
    let health = leader.health().await;
    assert!(health.iter().all(|h| h.healthy), "{health:?}");
    cluster.member(0).kill9();

    // The next commits go to other members. While the cluster elects a new raft
    // leader (when the dead member led it) a commit may time out with its outcome
    // unknown: the server then reads again and commits again, as here.
    let r = within(
        Duration::from_secs(20),
        "a commit after the member died",
        async {
            loop {
                match leader.range("").await {
                    Ok(_) => {}
                    Err(e) => {
                        eprintln!("range while a member is down: {e}");
                        continue;
                    }
                }
                match leader
                    .txn(term.fence.clone(), vec![put("job/b", "2")])
                    .await
                {
                    Ok(r) if r.succeeded => break r,
                    Ok(r) => eprintln!("refused (index {}): read again", r.revision),
                    Err(e) => eprintln!("commit while a member is down: {e}"),
                }
            }
        },
    )
    .await;
    assert!(r.revision >= 2);
    let change = within(
        Duration::from_secs(15),
        "the watch after the member died",
        async {
            loop {
                match w
                    .next()
                    .await
                    .expect("the watch goes on")
                    .expect("an event")
                {
                    WatchEvent::Change(c) if c.puts.iter().any(|kv| kv.key == "job/b") => break c,
                    WatchEvent::Change(_) => {}
                    WatchEvent::Reset => {
                        panic!("the watch should resume on another member, not reset")
                    }
                }
            }
        },
    )
    .await;
    assert!(change.revision.is_some_and(|i| i >= 2), "{change:?}");
    let health = leader.health().await;
    assert!(
        !health[0].healthy && health[1].healthy && health[2].healthy,
        "{health:?}"
    );
    assert_eq!(
        health.iter().filter(|h| h.is_leader).count(),
        1,
        "one raft leader among the live members: {health:?}"
    );

    // Keepalives moved too: the term outlives a lease TTL.
    tokio::time::sleep(Duration::from_secs(7)).await;
    assert!(
        !term.lost.is_cancelled(),
        "the term was lost although etcd lived on"
    );
    let r = leader
        .txn(term.fence.clone(), vec![put("job/c", "3")])
        .await
        .unwrap();
    assert!(r.succeeded);

    // The member comes back; everything still works.
    cluster.member(0).start_again();
    assert!(
        leader
            .txn(term.fence.clone(), vec![put("job/d", "4")])
            .await
            .unwrap()
            .succeeded
    );
    leader.election().close().await;
}
