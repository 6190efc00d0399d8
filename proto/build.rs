// .proto -> protox (pure Rust) -> FileDescriptorSet -> tonic-prost-build. No system protoc.
use prost::Message as _;
use std::{env, path::PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    const PROTOS: &[&str] = &[
        "proto/drover/plugin/v1/base.proto",
        "proto/drover/plugin/v1/driver.proto",
        "proto/drover/cluster/v1/cluster.proto",
        "proto/plugin/grpc_controller.proto",
        "proto/plugin/grpc_stdio.proto",
        "proto/plugin/grpc_broker.proto",
        // Nomad's plugin protocol (our own copies: Nomad's packages, names and field
        // numbers): Nomad drivers in plugin_dir, and the SDK serving Nomad agents.
        "proto/nomad/plugins/base/base.proto",
        "proto/nomad/plugins/drivers/driver.proto",
        "proto/nomad/plugins/device/device.proto",
        "proto/nomad/plugins/shared/hclspec/hcl_spec.proto",
        "proto/nomad/plugins/shared/structs/attribute.proto",
        "proto/nomad/plugins/shared/structs/recoverable_error.proto",
        "proto/nomad/plugins/shared/structs/stats.proto",
        // etcd's v3 API (trimmed copies, etcd's names and numbers) for the server's
        // etcd store.
        "proto/etcd/api/mvccpb/kv.proto",
        "proto/etcd/api/etcdserverpb/rpc.proto",
        "proto/etcd/api/v3electionpb/v3election.proto",
        // The CSI spec's csi.v1 (our own copy: the spec's names and numbers), for
        // talking to CSI plugins as a container orchestrator.
        "proto/csi/v1/csi.proto",
    ];
    // protox and tonic-prost-build emit no rerun-if-changed; without this Cargo reruns
    // the script on any change in the package.
    println!("cargo:rerun-if-changed=proto");

    let fds = protox::compile(PROTOS, ["proto"])?;
    let out = PathBuf::from(env::var("OUT_DIR")?);
    std::fs::write(out.join("drover_descriptor.bin"), fds.encode_to_vec())?;

    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
