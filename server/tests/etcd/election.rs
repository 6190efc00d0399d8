//! Leadership on a real etcd: one leader per prefix, handover on resign and on a lost
//! lease, and the fence: a commit of a term that is over is refused.

use std::time::Duration;

use drover_server::ServerInfo;
use drover_server::store::{EtcdOptions, EtcdStore, Op, Store};
use drover_test_support::etcd::{Etcd, SharedEtcd, shared};
use drover_test_support::within;

fn info(name: &str) -> ServerInfo {
    ServerInfo {
        name: name.into(),
        rpc_addr: format!("127.0.0.1:{}", 4000 + name.len()),
        http_addr: format!("127.0.0.1:{}", 5000 + name.len()),
        tls: false,
        version: "test".into(),
        started: 1_700_000_000,
    }
}

async fn store(etcd: &SharedEtcd, prefix: &str, ttl: Duration) -> EtcdStore {
    store_at(&etcd.endpoint(), prefix, ttl).await
}

async fn store_at(endpoint: &str, prefix: &str, ttl: Duration) -> EtcdStore {
    let mut o = EtcdOptions::new(vec![endpoint.to_owned()]);
    o.prefix = prefix.to_owned();
    o.lease_ttl = ttl;
    o.request_timeout = Duration::from_secs(3);
    EtcdStore::connect(o)
        .await
        .expect("connect to the test etcd")
}

fn put(key: &str, value: &str) -> Op {
    Op::Put {
        key: key.into(),
        value: value.as_bytes().to_vec(),
    }
}

#[tokio::test]
async fn one_leader_per_prefix_and_the_next_takes_over_when_it_resigns() {
    let Some(etcd) = shared() else { return };
    let prefix = etcd.unique_prefix();
    let a = store(&etcd, &prefix, Duration::from_secs(10)).await;
    let b = store(&etcd, &prefix, Duration::from_secs(10)).await;
    let (ea, eb) = (a.election(), b.election());
    assert_eq!(ea.leader().await.unwrap(), None, "nobody campaigned yet");

    let term_a = within(
        Duration::from_secs(10),
        "a's campaign",
        ea.campaign(info("a")),
    )
    .await
    .unwrap();
    assert_eq!(ea.leader().await.unwrap(), Some(info("a")));
    assert_eq!(eb.leader().await.unwrap(), Some(info("a")), "b sees a lead");

    // b campaigns: it must not win while a leads.
    let eb2 = eb.clone();
    let mut campaign_b = tokio::spawn(async move { eb2.campaign(info("b")).await });
    assert!(
        tokio::time::timeout(Duration::from_millis(1500), &mut campaign_b)
            .await
            .is_err(),
        "b won while a leads"
    );
    assert!(!term_a.lost.is_cancelled());

    ea.resign().await;
    assert!(
        term_a.lost.is_cancelled(),
        "a's term is over once it resigned"
    );
    let term_b = within(
        Duration::from_secs(10),
        "b's campaign after a resigned",
        campaign_b,
    )
    .await
    .unwrap()
    .unwrap();
    assert!(
        term_b.id > term_a.id,
        "terms grow: {} then {}",
        term_a.id,
        term_b.id
    );
    assert_eq!(ea.leader().await.unwrap().unwrap().name, "b");

    // a's commits are fenced off, b's go through.
    a.range("").await.unwrap();
    b.range("").await.unwrap();
    let r = a
        .txn(term_a.fence.clone(), vec![put("job/x", "a")])
        .await
        .unwrap();
    assert!(!r.succeeded, "a commit of an ended term");
    let r = b
        .txn(term_b.fence.clone(), vec![put("job/x", "b")])
        .await
        .unwrap();
    assert!(r.succeeded);
    eb.close().await;
    ea.close().await;
}

#[tokio::test]
async fn a_revoked_lease_ends_the_term_and_fences_its_commits() {
    let Some(etcd) = shared() else { return };
    let prefix = etcd.unique_prefix();
    let a = store(&etcd, &prefix, Duration::from_secs(5)).await;
    let b = store(&etcd, &prefix, Duration::from_secs(5)).await;
    let (ea, eb) = (a.election(), b.election());
    let term_a = within(
        Duration::from_secs(10),
        "a's campaign",
        ea.campaign(info("a")),
    )
    .await
    .unwrap();
    a.range("").await.unwrap();
    assert!(
        a.txn(term_a.fence.clone(), vec![put("job/1", "a")])
            .await
            .unwrap()
            .succeeded
    );

    // Someone revokes a's lease (an operator, or etcd expiring it while a was paused).
    let lease = leader_lease(&etcd.endpoint(), &format!("{prefix}election")).await;
    revoke(&etcd.endpoint(), lease).await;
    within(
        Duration::from_secs(5),
        "a to notice its lost term",
        term_a.lost.cancelled(),
    )
    .await;
    let r = a
        .txn(term_a.fence.clone(), vec![put("job/2", "a")])
        .await
        .unwrap();
    assert!(
        !r.succeeded,
        "a commit fenced by a revoked term must be refused"
    );
    assert_eq!(r.revision, 1);

    let term_b = within(
        Duration::from_secs(10),
        "b's campaign",
        eb.campaign(info("b")),
    )
    .await
    .unwrap();
    // a campaigns again on a new lease and waits behind b.
    let ea2 = ea.clone();
    let mut again = tokio::spawn(async move { ea2.campaign(info("a")).await });
    if let Ok(r) = tokio::time::timeout(Duration::from_millis(1000), &mut again).await {
        panic!("a won while b leads: {:?}", r.map(|t| t.map(|t| t.id)));
    }
    eb.close().await;
    within(
        Duration::from_secs(5),
        "b's term to end on close",
        term_b.lost.cancelled(),
    )
    .await;
    let term_a2 = within(Duration::from_secs(10), "a to lead again", again)
        .await
        .unwrap()
        .unwrap();
    assert!(term_a2.id > term_b.id);
    a.range("").await.unwrap();
    assert!(
        a.txn(term_a2.fence.clone(), vec![put("job/2", "a")])
            .await
            .unwrap()
            .succeeded
    );
    ea.close().await;
}

#[tokio::test]
async fn a_leader_cut_off_from_etcd_gives_up_its_term_within_the_lease_ttl() {
    let Some(etcd) = Etcd::start() else { return };
    let ttl = Duration::from_secs(2);
    let a = store_at(&etcd.endpoint(), "/drover/", ttl).await;
    let term = within(
        Duration::from_secs(10),
        "a's campaign",
        a.election().campaign(info("a")),
    )
    .await
    .unwrap();
    // etcd stops answering (paused, partitioned): nothing tells a its lease is gone,
    // its own clock must.
    let pid = rustix::process::Pid::from_raw(etcd.pid().unwrap() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::STOP).unwrap();
    let started = std::time::Instant::now();
    let r = tokio::time::timeout(ttl + Duration::from_secs(2), term.lost.cancelled()).await;
    rustix::process::kill_process(pid, rustix::process::Signal::CONT).unwrap();
    assert!(
        r.is_ok(),
        "the term still stands {:?} after etcd stopped answering",
        started.elapsed()
    );
    assert!(
        started.elapsed() <= ttl,
        "lost after {:?}, later than the lease TTL {ttl:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_leaders_lease_is_kept_alive_past_its_ttl() {
    let Some(etcd) = shared() else { return };
    let prefix = etcd.unique_prefix();
    let ttl = Duration::from_secs(2);
    let a = store(&etcd, &prefix, ttl).await;
    let term = within(
        Duration::from_secs(10),
        "a's campaign",
        a.election().campaign(info("a")),
    )
    .await
    .unwrap();
    // Nothing to poll for: the term must simply last, well past a TTL.
    tokio::time::sleep(ttl * 3).await;
    assert!(
        !term.lost.is_cancelled(),
        "the term ended although etcd ran"
    );
    let lease = leader_lease(&etcd.endpoint(), &format!("{prefix}election")).await;
    assert!(
        time_to_live(&etcd.endpoint(), lease).await > 0,
        "etcd still has the lease"
    );
    a.range("").await.unwrap();
    assert!(
        a.txn(term.fence.clone(), vec![put("job/a", "1")])
            .await
            .unwrap()
            .succeeded
    );
    a.election().close().await;
    assert!(
        time_to_live(&etcd.endpoint(), lease).await <= 0,
        "closed: lease revoked"
    );
}

async fn time_to_live(endpoint: &str, id: i64) -> i64 {
    use drover_proto::etcd::etcdserverpb::{LeaseTimeToLiveRequest, lease_client::LeaseClient};
    let mut c = LeaseClient::connect(endpoint.to_owned()).await.unwrap();
    c.lease_time_to_live(LeaseTimeToLiveRequest { id, keys: false })
        .await
        .unwrap()
        .into_inner()
        .ttl
}

#[tokio::test]
async fn after_etcd_restarts_the_next_leader_does_not_wait_for_the_old_lease() {
    let Some(mut etcd) = Etcd::start() else {
        return;
    };
    let ttl = Duration::from_secs(8);
    let a = store_at(&etcd.endpoint(), "/drover/", ttl).await;
    let b = store_at(&etcd.endpoint(), "/drover/", ttl).await;
    let term_a = within(
        Duration::from_secs(10),
        "a's campaign",
        a.election().campaign(info("a")),
    )
    .await
    .unwrap();
    etcd.kill9();
    within(
        ttl + Duration::from_secs(2),
        "a to give its term up while etcd is down",
        term_a.lost.cancelled(),
    )
    .await;
    etcd.start_again();
    // etcd renews every lease's TTL when it comes back: a's old key would hold the
    // election for another 8 s, had a not revoked its lost lease.
    let started = std::time::Instant::now();
    let term_b = within(ttl / 2, "b to lead soon after etcd came back", async {
        loop {
            match b.election().campaign(info("b")).await {
                Ok(t) => break t,
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    })
    .await;
    assert!(started.elapsed() < ttl / 2);
    b.range("").await.unwrap();
    assert!(
        b.txn(term_b.fence.clone(), vec![put("job/b", "1")])
            .await
            .unwrap()
            .succeeded
    );
    let r = a
        .txn(term_a.fence.clone(), vec![put("job/a", "1")])
        .await
        .unwrap();
    assert!(!r.succeeded, "a's old term is fenced off");
    b.election().close().await;
}

#[tokio::test]
async fn members_are_the_registered_servers_and_leave_on_close() {
    let Some(etcd) = shared() else { return };
    let prefix = etcd.unique_prefix();
    let a = store(&etcd, &prefix, Duration::from_secs(10)).await;
    let b = store(&etcd, &prefix, Duration::from_secs(10)).await;
    let (ea, eb) = (a.election(), b.election());
    let ra = tokio::spawn({
        let e = ea.clone();
        async move { e.register(info("a")).await }
    });
    let rb = tokio::spawn({
        let e = eb.clone();
        async move { e.register(info("bb")).await }
    });
    within(Duration::from_secs(10), "both registered", async {
        while ea.members().await.unwrap().len() < 2 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let mut names: Vec<String> = ea
        .members()
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    names.sort();
    assert_eq!(names, ["a", "bb"]);
    assert_eq!(eb.lease_ttl(), Duration::from_secs(10));
    eb.close().await;
    within(
        Duration::from_secs(5),
        "b's registration to go on close",
        async {
            while ea.members().await.unwrap().len() != 1 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        },
    )
    .await;
    ra.abort();
    rb.abort();
    ea.close().await;
}

#[tokio::test]
async fn a_registration_comes_back_on_a_new_lease_after_its_lease_is_gone() {
    let Some(etcd) = shared() else { return };
    let prefix = etcd.unique_prefix();
    let a = store(&etcd, &prefix, Duration::from_secs(5)).await;
    let ea = a.election();
    let reg = tokio::spawn({
        let e = ea.clone();
        async move { e.register(info("a")).await }
    });
    let lease = within(Duration::from_secs(10), "a registered", async {
        loop {
            if let Some(l) =
                registration_lease(&etcd.endpoint(), &format!("{prefix}servers/a")).await
            {
                break l;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    revoke(&etcd.endpoint(), lease).await;
    let again = within(Duration::from_secs(10), "a registered again", async {
        loop {
            match registration_lease(&etcd.endpoint(), &format!("{prefix}servers/a")).await {
                Some(l) if l != lease => break l,
                _ => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    })
    .await;
    assert_ne!(again, lease);
    assert_eq!(ea.members().await.unwrap(), [info("a")]);
    ea.close().await;
    within(
        Duration::from_secs(5),
        "register to return after close",
        reg,
    )
    .await
    .unwrap()
    .unwrap();
    assert!(ea.members().await.unwrap().is_empty());
    assert!(
        ea.campaign(info("a")).await.is_err(),
        "no campaign after close"
    );
}

/// The lease of the key `key`, if it exists.
async fn registration_lease(endpoint: &str, key: &str) -> Option<i64> {
    use drover_proto::etcd::etcdserverpb::{RangeRequest, kv_client::KvClient};
    let mut c = KvClient::connect(endpoint.to_owned()).await.unwrap();
    let r = c
        .range(RangeRequest {
            key: key.as_bytes().to_vec(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    r.kvs.first().map(|kv| kv.lease)
}

#[tokio::test]
async fn a_lease_shorter_than_etcds_minimum_is_raised() {
    let Some(etcd) = shared() else { return };
    let s = store(&etcd, &etcd.unique_prefix(), Duration::from_millis(200)).await;
    assert_eq!(s.election().lease_ttl(), Duration::from_secs(2));
}

async fn leader_lease(endpoint: &str, name: &str) -> i64 {
    use drover_proto::etcd::v3electionpb::{LeaderRequest, election_client::ElectionClient};
    let mut c = ElectionClient::connect(endpoint.to_owned()).await.unwrap();
    let r = c
        .leader(LeaderRequest {
            name: name.as_bytes().to_vec(),
        })
        .await
        .unwrap()
        .into_inner();
    r.kv.expect("a leader key").lease
}

async fn revoke(endpoint: &str, id: i64) {
    use drover_proto::etcd::etcdserverpb::{LeaseRevokeRequest, lease_client::LeaseClient};
    let mut c = LeaseClient::connect(endpoint.to_owned()).await.unwrap();
    c.lease_revoke(LeaseRevokeRequest { id }).await.unwrap();
}
