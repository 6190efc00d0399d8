//! Evaluations as Nomad's API carries them (`api/evaluations.go`).
