//! The redb store: revisions, compare-and-set, prefix ranges, durability across a
//! reopen, and clear errors for files that are not a server store.

use drover_server::store::RedbStore;
use drover_server::store::{Condition, Op, Store, StoreError};

fn put(key: &str, value: &str) -> Op {
    Op::Put {
        key: key.into(),
        value: value.as_bytes().to_vec(),
    }
}

#[tokio::test]
async fn revisions_grow_per_transaction_and_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let s = RedbStore::open(dir.path()).unwrap();
        assert_eq!(s.revision().await.unwrap(), 0);
        let r = s
            .txn(vec![], vec![put("job/a", "1"), put("job/b", "2")])
            .await
            .unwrap();
        assert!(r.succeeded);
        assert_eq!(r.revision, 1, "one transaction, one revision");
        let r = s.txn(vec![], vec![put("job/a", "3")]).await.unwrap();
        assert_eq!(r.revision, 2);
    }
    let s = RedbStore::open(dir.path()).unwrap();
    assert_eq!(s.revision().await.unwrap(), 2);
    let (kvs, rev) = s.range("job/").await.unwrap();
    assert_eq!(rev, 2);
    assert_eq!(kvs.len(), 2);
    assert_eq!(kvs[0].key, "job/a");
    assert_eq!(kvs[0].value, b"3");
    assert_eq!((kvs[0].create_revision, kvs[0].mod_revision), (1, 2));
    assert_eq!((kvs[1].create_revision, kvs[1].mod_revision), (1, 1));
}

#[tokio::test]
async fn range_returns_only_the_prefix_in_key_order() {
    let dir = tempfile::tempdir().unwrap();
    let s = RedbStore::open(dir.path()).unwrap();
    s.txn(
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
    let (kvs, _) = s.range("node/").await.unwrap();
    let keys: Vec<&str> = kvs.iter().map(|k| k.key.as_str()).collect();
    assert_eq!(keys, ["node/1", "node/2"]);
    let (all, _) = s.range("").await.unwrap();
    assert_eq!(all.len(), 5);
}

/// The store writes a transaction's ops in key order (B-tree locality); ops on one
/// key still take effect in the order given.
#[tokio::test]
async fn ops_on_one_key_keep_their_order_within_a_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let s = RedbStore::open(dir.path()).unwrap();
    let delete = |k: &str| Op::Delete { key: k.into() };
    s.txn(
        vec![],
        vec![
            put("b", "1"),
            put("a", "1"),
            delete("b"),
            put("a", "2"),
            delete("c"),
            put("c", "3"),
        ],
    )
    .await
    .unwrap();
    let (kvs, _) = s.range("").await.unwrap();
    let got: Vec<(&str, &[u8])> = kvs
        .iter()
        .filter(|kv| ["a", "b", "c"].contains(&kv.key.as_str()))
        .map(|kv| (kv.key.as_str(), kv.value.as_slice()))
        .collect();
    assert_eq!(got, [("a", b"2".as_slice()), ("c", b"3".as_slice())]);
}

#[tokio::test]
async fn conditions_compare_and_set_and_a_failed_txn_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let s = RedbStore::open(dir.path()).unwrap();
    // Create only if absent.
    let absent = |k: &str| Condition::ModRevision {
        key: k.into(),
        revision: 0,
    };
    let r = s
        .txn(vec![absent("lock")], vec![put("lock", "me")])
        .await
        .unwrap();
    assert!(r.succeeded);
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

    // Update only if unchanged since revision 1; create revision stays.
    let r = s
        .txn(
            vec![Condition::ModRevision {
                key: "lock".into(),
                revision: 1,
            }],
            vec![put("lock", "me2")],
        )
        .await
        .unwrap();
    assert!(r.succeeded);
    let stale = s
        .txn(
            vec![Condition::ModRevision {
                key: "lock".into(),
                revision: 1,
            }],
            vec![put("lock", "late")],
        )
        .await
        .unwrap();
    assert!(!stale.succeeded, "mod revision moved to 2");
    let fenced = s
        .txn(
            vec![Condition::CreateRevision {
                key: "lock".into(),
                revision: 1,
            }],
            vec![Op::Delete { key: "lock".into() }],
        )
        .await
        .unwrap();
    assert!(fenced.succeeded, "create revision is still 1");
    let (kvs, rev) = s.range("").await.unwrap();
    assert!(kvs.is_empty());
    assert_eq!(rev, 3);
}

#[tokio::test]
async fn a_second_open_of_the_same_dir_is_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let _first = RedbStore::open(dir.path()).unwrap();
    let err = RedbStore::open(dir.path()).unwrap_err();
    assert!(
        err.to_string().contains("in use by another server"),
        "{err}"
    );
}

#[tokio::test]
async fn garbage_and_foreign_files_are_corrupt_errors_not_panics() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("server.db"), vec![0x5a; 8192]).unwrap();
    let err = RedbStore::open(dir.path()).unwrap_err();
    assert!(matches!(err, StoreError::Corrupt(_)), "{err}");
    assert!(err.to_string().contains("server.db"), "{err}");

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("server.db"), b"").unwrap();
    let err = RedbStore::open(dir.path()).unwrap_err();
    assert!(matches!(err, StoreError::Corrupt(_)), "{err}");

    // A valid redb file of someone else.
    let dir = tempfile::tempdir().unwrap();
    {
        let db = redb::Database::create(dir.path().join("server.db")).unwrap();
        let t = db.begin_write().unwrap();
        {
            let def: redb::TableDefinition<&str, &str> = redb::TableDefinition::new("other");
            t.open_table(def).unwrap().insert("k", "v").unwrap();
        }
        t.commit().unwrap();
    }
    let err = RedbStore::open(dir.path()).unwrap_err();
    assert!(
        err.to_string().contains("not a Drover server store"),
        "{err}"
    );
}
