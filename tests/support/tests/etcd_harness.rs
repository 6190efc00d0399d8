//! The etcd harness itself: a private etcd answers, survives kill -9 and a start on
//! the same data dir, and is gone after drop.

use drover_test_support::etcd::Etcd;
use drover_test_support::procs::stat;

#[test]
fn a_private_etcd_starts_restarts_and_stops_by_pid() {
    let Some(mut e) = Etcd::start() else { return };
    let pid = e.pid().expect("running");
    assert!(e.endpoint().starts_with("http://127.0.0.1:"));
    assert!(stat(pid).is_some_and(|s| s.state != 'Z'));
    e.kill9();
    assert!(e.pid().is_none());
    assert!(stat(pid).is_none(), "etcd {pid} was killed and reaped");
    e.start_again();
    let pid2 = e.pid().expect("running again");
    assert!(e.data_dir().join("member").is_dir(), "same data dir");
    assert!(e.log_text().contains("--- restarted ---"));
    drop(e);
    assert!(stat(pid2).is_none(), "etcd {pid2} still runs after drop");
}

#[test]
fn unique_prefixes_differ() {
    let a = drover_test_support::etcd::unique_prefix();
    let b = drover_test_support::etcd::unique_prefix();
    assert_ne!(a, b);
    assert!(a.starts_with("/drover-test-") && a.ends_with('/'));
}
