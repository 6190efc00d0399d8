//! How the server is reached: the HTTP API (`http.rs`), the node RPCs and the
//! forwarded API on gRPC (`rpc.rs`), the forwarding of writes from a follower to the
//! leader (`forward.rs`), and the TLS settings of the listeners (`tls.rs`).

pub mod forward;
pub mod http;
pub mod rpc;
pub mod tls;
