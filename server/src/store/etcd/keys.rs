//! The key layout under the prefix and the transaction ops built on it (puts,
//! ranges, a transaction split to fit etcd's limits).

use std::collections::HashMap;

use drover_proto::etcd::etcdserverpb as pb;

use crate::store::{Op, StoreError};

/// Bytes kept free in every transaction for the request's framing (key prefixes,
/// compares, protobuf tags).
pub(super) const FRAMING_MARGIN: usize = 64 * 1024;

/// The index counter's key under the prefix.
pub(super) const INDEX_KEY: &str = "meta/index";

/// A key of the server's state (not the store's or the election's own keys).
pub(super) fn is_state_key(key: &str) -> bool {
    !(key.starts_with("meta/")
        || key == "schema"
        || key == "election"
        || key.starts_with("election/")
        || key.starts_with("servers/"))
}

pub(super) fn put_op(key: Vec<u8>, value: Vec<u8>) -> pb::RequestOp {
    pb::RequestOp {
        request: Some(pb::request_op::Request::RequestPut(pb::PutRequest {
            key,
            value,
            lease: 0,
        })),
    }
}

pub(super) fn range_op(key: Vec<u8>) -> pb::RequestOp {
    pb::RequestOp {
        request: Some(pb::request_op::Request::RequestRange(pb::RangeRequest {
            key,
            ..Default::default()
        })),
    }
}

pub(super) fn first_range_kv(
    r: &[pb::ResponseOp],
) -> Option<&drover_proto::etcd::mvccpb::KeyValue> {
    r.iter().find_map(|r| match &r.response {
        Some(pb::response_op::Response::ResponseRange(rr)) => rr.kvs.first(),
        _ => None,
    })
}

pub(super) fn header_revision(h: Option<&pb::ResponseHeader>) -> i64 {
    h.map_or(0, |h| h.revision)
}

pub(super) fn to_u64(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

pub(super) fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The ops with only the last write of each key, in the order of those last writes
/// (etcd refuses a key twice in one transaction).
pub(super) fn dedup(ops: Vec<Op>) -> Vec<Op> {
    let key = |op: &Op| match op {
        Op::Put { key, .. } | Op::Delete { key } => key.clone(),
    };
    let mut last: HashMap<String, usize> = HashMap::with_capacity(ops.len());
    for (i, op) in ops.iter().enumerate() {
        last.insert(key(op), i);
    }
    if last.len() == ops.len() {
        return ops;
    }
    ops.into_iter()
        .enumerate()
        .filter(|(i, op)| last.get(&key(op)) == Some(i))
        .map(|(_, op)| op)
        .collect()
}

/// The ops in parts etcd takes: each at most `max_ops - 1` ops (the last part adds
/// the index) and `max_bytes` less a margin of keys and values. Always at least one
/// (possibly empty) part.
pub(super) fn split(
    ops: Vec<Op>,
    limits: crate::store::TxnLimits,
    prefix_len: usize,
    conditions: usize,
) -> Result<Vec<Vec<Op>>, StoreError> {
    if conditions + 1 > limits.max_ops {
        return Err(StoreError::TooLarge(format!(
            "{conditions} conditions, etcd takes {} compares per transaction",
            limits.max_ops
        )));
    }
    let max_ops = limits.max_ops.saturating_sub(1).max(1);
    let budget = limits
        .max_bytes
        .saturating_sub(FRAMING_MARGIN.min(limits.max_bytes / 4));
    let mut parts: Vec<Vec<Op>> = vec![Vec::new()];
    let mut bytes = 0usize;
    for op in ops {
        // Key (twice counted: the op and its framing), value, tags.
        let size = match &op {
            Op::Put { key, value } => prefix_len + key.len() + value.len() + 16,
            Op::Delete { key } => prefix_len + key.len() + 16,
        };
        if size > budget {
            let key = match &op {
                Op::Put { key, .. } | Op::Delete { key } => key,
            };
            return Err(StoreError::TooLarge(format!(
                "{key:?} is {size} bytes with its value, more than the {budget} bytes etcd \
                 takes in one request"
            )));
        }
        let cur = parts.last_mut().expect("at least one part");
        if cur.len() >= max_ops || bytes + size > budget {
            parts.push(vec![op]);
            bytes = size;
        } else {
            cur.push(op);
            bytes += size;
        }
    }
    Ok(parts)
}
