//! The etcd harness itself: a private etcd answers, survives kill -9 and a start on
//! the same data dir, and is gone after drop.

use drover_test_support::etcd::Etcd;

#[test]
fn a_private_etcd_starts_restarts_and_stops_by_pid() {
    let Some(mut e) = Etcd::start() else { return };
    let pid = e.pid().expect("running");
    assert!(e.endpoint().starts_with("http://127.0.0.1:"));
    assert!(std::path::Path::new(&format!("/proc/{pid}")).exists());
    e.kill9();
    assert!(e.pid().is_none());
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists()
            || drover_test_support::procs::stat(pid).is_none_or(|s| s.state == 'Z')
    );
    e.start_again();
    let pid2 = e.pid().expect("running again");
    assert!(e.data_dir().join("member").is_dir(), "same data dir");
    drop(e);
    assert!(
        drover_test_support::procs::stat(pid2).is_none(),
        "etcd {pid2} still runs after drop"
    );
}
