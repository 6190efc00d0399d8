//! Nodes as Nomad's API carries them (`api/nodes.go`).
