//! How the server is reached: the HTTP API (`http/`), the node RPCs and the
//! forwarded API on gRPC (`rpc/`), the forwarding of writes from a follower to the
//! leader (`forward.rs`), the TLS settings of the listeners (`tls.rs`), and the one
//! constant-time token compare both listeners use (`auth.rs`).

pub mod auth;
pub mod forward;
pub mod http;
pub mod rpc;
pub mod tls;

/// Largest message either side decodes: a node's complete allocation set travels in
/// one message (each with its group spec), so gRPC's 4 MiB default is too small for
/// nodes with thousands of allocations.
pub const MAX_MESSAGE_BYTES: usize = 64 << 20;
