//! The task map: task id to running (or exited, not yet destroyed) task. The SDK's
//! [`TaskStore`](drover_plugin_sdk::store::TaskStore) with reservations, over this
//! driver's task type.

pub(crate) type Store = drover_plugin_sdk::store::TaskStore<crate::handle::Task>;
