//! The bridge network with the real CNI plugins and real namespaces (root only; a
//! missing plugin skips loudly, and fails under CI=true).

use std::io::{Read as _, Write as _};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::os::fd::AsFd as _;
use std::path::Path;
use std::time::Duration;

use drover_test_support::cni::{Footprint, plugins};

use super::*;

fn bridge(cni: PathBuf) -> Bridge {
    Bridge::new(BridgeConfig {
        cni_path: vec![cni],
        ..BridgeConfig::default()
    })
    .expect("the default bridge config is valid")
}

fn alloc_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// A listener inside namespace `netns` on `port`, answering every connection with
/// `hello`. A socket belongs to the namespace it was made in, so a thread enters the
/// namespace only to make it.
fn listen_in(netns: &Path, port: u16) -> TcpListener {
    let ns = std::fs::File::open(netns).expect("open the namespace");
    std::thread::scope(|s| {
        s.spawn(|| {
            rustix::thread::move_into_link_name_space(
                ns.as_fd(),
                Some(rustix::thread::LinkNameSpaceType::Network),
            )
            .expect("enter the namespace");
            TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)).expect("listen in the namespace")
        })
        .join()
        .expect("the listening thread")
    })
}

fn serve(listener: TcpListener) {
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut c) = conn else { return };
            let _ = c.write_all(b"hello from the namespace\n");
        }
    });
}

fn fetch(port: u16) -> std::io::Result<String> {
    let mut c =
        TcpStream::connect_timeout(&(Ipv4Addr::LOCALHOST, port).into(), Duration::from_secs(2))?;
    c.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut s = String::new();
    c.read_to_string(&mut s)?;
    Ok(s)
}

fn mapping(host: u16, container: u16) -> PortMapping {
    PortMapping {
        host_port: host,
        container_port: container,
        protocol: "tcp".into(),
        host_ip: String::new(),
    }
}

#[tokio::test]
async fn setup_gives_an_address_and_forwards_the_host_port_teardown_leaves_nothing() {
    let Some(cni) = plugins() else { return };
    let _one = GUARD.lock().await;
    let b = bridge(cni);
    let id = alloc_id();
    let host_port = drover_test_support::net::free_local_addr().port();
    let mut st = b.plan(&id, vec![mapping(host_port, 8080)]);
    b.setup(&mut st).await.expect("setup");

    let address = st.address.clone().expect("an address");
    let ip: Ipv4Addr = address.parse().expect("an IPv4 address");
    let (net, len) = parse_cidr(DEFAULT_SUBNET).unwrap();
    let mask = u32::MAX << (32 - len);
    assert_eq!(
        u32::from(ip) & mask,
        u32::from(net),
        "{ip} in {DEFAULT_SUBNET}"
    );
    assert!(
        netns::is_mounted(&st.netns),
        "the namespace is kept by its mount"
    );
    let seen = Footprint::observe(&b.config().name, &id, &st.netns);
    assert_eq!(
        seen.ip.as_deref(),
        Some(address.as_str()),
        "eth0 has the address"
    );
    assert!(
        seen.host_ifindex.is_some(),
        "eth0 is a veth with a host end"
    );

    serve(listen_in(&st.netns, 8080));
    let answer = fetch(host_port).expect("127.0.0.1:<host port> reaches the namespace");
    assert_eq!(answer, "hello from the namespace\n");

    b.teardown(&st).await.expect("teardown");
    assert_eq!(seen.remains(), Vec::<String>::new());
    assert!(
        fetch(host_port).is_err(),
        "nothing answers on the host port"
    );
    // Twice is fine (an agent restarted mid-teardown does it again).
    b.teardown(&st).await.expect("teardown again");
}

#[tokio::test]
async fn teardown_without_the_add_result_still_removes_everything() {
    // The agent died between the plugins' ADD and recording its result: the record
    // holds only the plan.
    let Some(cni) = plugins() else { return };
    let _one = GUARD.lock().await;
    let b = bridge(cni);
    let id = alloc_id();
    let host_port = drover_test_support::net::free_local_addr().port();
    let plan = b.plan(&id, vec![mapping(host_port, 80)]);
    let mut st = plan.clone();
    b.setup(&mut st).await.expect("setup");
    let seen = Footprint::observe(&b.config().name, &id, &st.netns);
    assert!(seen.ip.is_some());

    b.teardown(&plan)
        .await
        .expect("teardown from the plan alone");
    assert_eq!(seen.remains(), Vec::<String>::new());
}

#[tokio::test]
async fn setup_again_after_an_unfinished_one_starts_clean() {
    let Some(cni) = plugins() else { return };
    let _one = GUARD.lock().await;
    let b = bridge(cni);
    let id = alloc_id();
    let plan = b.plan(&id, Vec::new());
    let mut first = plan.clone();
    b.setup(&mut first).await.expect("first setup");
    let seen = Footprint::observe(&b.config().name, &id, &first.netns);
    // The agent died before recording `first`: it sets up from the plan again.
    let mut second = plan.clone();
    b.setup(&mut second).await.expect("second setup");
    assert!(second.address.is_some());
    b.check(&second).await.expect("CHECK after ADD");
    b.teardown(&second).await.expect("teardown");
    assert_eq!(seen.remains(), Vec::<String>::new());
    let again = Footprint::observe(&b.config().name, &id, &second.netns);
    assert_eq!(again.remains(), Vec::<String>::new());
}

#[tokio::test]
async fn a_failing_plugin_is_named_with_what_it_said_and_nothing_is_left() {
    let Some(cni) = plugins() else { return };
    let _one = GUARD.lock().await;
    let b = bridge(cni);
    let id = alloc_id();
    let mut st = b.plan(&id, Vec::new());
    // A subnet the bridge plugin cannot use.
    st.conflist.plugins[1]["ipam"]["ranges"] = serde_json::json!([[{"subnet": "not-a-subnet"}]]);
    let e = b.setup(&mut st).await.expect_err("a bad subnet fails");
    let text = e.to_string();
    assert!(text.contains("bridge") && text.contains("ADD"), "{text}");
    assert!(
        text.contains("not-a-subnet"),
        "the plugin's own words: {text}"
    );
    assert!(!st.netns.exists(), "the namespace made for it is gone");
    assert!(st.address.is_none());
}

#[test]
fn bad_settings_are_refused_naming_the_setting() {
    let e = Bridge::new(BridgeConfig {
        name: "a-name-longer-than-15".into(),
        ..BridgeConfig::default()
    })
    .unwrap_err();
    assert!(e.to_string().contains("bridge_network_name"), "{e}");
    for subnet in [
        "10.0.0.0",
        "10.0.0.0/33",
        "10.0.0.0/31",
        "fd00::/64",
        "x/20",
    ] {
        let e = Bridge::new(BridgeConfig {
            subnet: subnet.into(),
            ..BridgeConfig::default()
        })
        .unwrap_err();
        assert!(
            e.to_string().contains("bridge_network_subnet"),
            "{subnet}: {e}"
        );
    }
}

#[test]
fn the_address_is_the_one_on_the_namespace_interface() {
    let r = serde_json::json!({
        "cniVersion": "0.4.0",
        "interfaces": [
            {"name": "drover", "mac": "x"},
            {"name": "veth1", "mac": "y"},
            {"name": "eth0", "mac": "z", "sandbox": "/run/netns/a"}
        ],
        "ips": [
            {"version": "4", "address": "10.1.0.1/24", "interface": 0},
            {"version": "4", "address": "10.1.0.7/24", "interface": 2}
        ]
    });
    assert_eq!(address_of(&r, "eth0").as_deref(), Some("10.1.0.7"));
}

#[test]
fn a_reservation_is_found_by_container_and_interface() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("10.1.0.5"), "other\neth0").unwrap();
    std::fs::write(dir.path().join("10.1.0.6"), "mine\r\neth0").unwrap();
    std::fs::write(dir.path().join("last_reserved_ip.0"), "10.1.0.6").unwrap();
    assert_eq!(
        reserved_address(dir.path(), "mine", "eth0"),
        Some(Ipv4Addr::new(10, 1, 0, 6))
    );
    assert_eq!(reserved_address(dir.path(), "nobody", "eth0"), None);
}

/// `nsenter --net=NETNS ARGS` (util-linux), panicking with what it said.
fn in_netns(netns: &Path, args: &[&str]) {
    let out = std::process::Command::new("nsenter")
        .arg(format!("--net={}", netns.display()))
        .args(args)
        .output()
        .expect("run nsenter");
    assert!(
        out.status.success(),
        "nsenter {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// From inside `netns`, connect to 127.0.0.1:`port` (which the namespace routed to
/// the bridge): whether a connection was made within 2 s.
fn connects_from(netns: &Path, port: u16) -> bool {
    let ns = std::fs::File::open(netns).expect("open the namespace");
    std::thread::scope(|s| {
        s.spawn(|| {
            rustix::thread::move_into_link_name_space(
                ns.as_fd(),
                Some(rustix::thread::LinkNameSpaceType::Network),
            )
            .expect("enter the namespace");
            TcpStream::connect_timeout(&(Ipv4Addr::LOCALHOST, port).into(), Duration::from_secs(2))
                .is_ok()
        })
        .join()
        .expect("the connecting thread")
    })
}

fn guard_rule_args(op: &str, bridge: &str) -> Vec<String> {
    let mut args = vec!["-w".to_owned(), op.to_owned(), "INPUT".to_owned()];
    args.extend(localhost_guard_rule(bridge));
    args
}

/// The attack of CVE-2020-8558 against the node: a task that routes 127.0.0.0/8 to
/// its gateway (it may: CAP_NET_ADMIN in its own namespace, or a raw socket) sends a
/// SYN for 127.0.0.1 onto the bridge, where portmap turned `route_localnet` on. With
/// the guard it never reaches the node's loopback listener; without it (removed for a
/// moment, to show the attack is real on this kernel) it does.
#[tokio::test]
async fn a_namespace_on_the_bridge_cannot_reach_the_nodes_loopback() {
    let Some(cni) = plugins() else { return };
    let _one = GUARD.lock().await;
    let b = bridge(cni);
    let id = alloc_id();
    let host_port = drover_test_support::net::free_local_addr().port();
    let mut st = b.plan(&id, vec![mapping(host_port, 8080)]);
    b.setup(&mut st).await.expect("setup");
    let localnet = std::fs::read_to_string(format!(
        "/proc/sys/net/ipv4/conf/{}/route_localnet",
        b.config().name
    ))
    .unwrap_or_default();
    eprintln!("route_localnet on the bridge: {}", localnet.trim());

    // The node's loopback-only service.
    let secret = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("listen on 127.0.0.1");
    let port = secret.local_addr().unwrap().port();
    secret.set_nonblocking(true).unwrap();

    // The task's side: 127.0.0.0/8 off its loopback and routed to the gateway.
    // host-local's gateway: the subnet's first address, on the bridge.
    let (net, _) = parse_cidr(&b.config().subnet).unwrap();
    let gateway = Ipv4Addr::from(u32::from(net) + 1).to_string();
    in_netns(&st.netns, &["ip", "addr", "flush", "dev", "lo"]);
    in_netns(
        &st.netns,
        &["ip", "route", "flush", "table", "local", "dev", "lo"],
    );
    in_netns(
        &st.netns,
        &["sysctl", "-q", "-w", "net.ipv4.conf.all.route_localnet=1"],
    );
    in_netns(
        &st.netns,
        &["sysctl", "-q", "-w", "net.ipv4.conf.eth0.route_localnet=1"],
    );
    in_netns(
        &st.netns,
        &[
            "ip",
            "route",
            "add",
            "127.0.0.0/8",
            "via",
            &gateway,
            "dev",
            "eth0",
        ],
    );

    assert!(
        !connects_from(&st.netns, port),
        "a namespace on the bridge reached the node's 127.0.0.1:{port}"
    );
    // The control: the same attempt without the guard gets through.
    let bridge_name = b.config().name.clone();
    let del = std::process::Command::new("iptables")
        .args(guard_rule_args("-D", &bridge_name))
        .output()
        .expect("iptables -D");
    assert!(
        del.status.success(),
        "{}",
        String::from_utf8_lossy(&del.stderr)
    );
    let reached = connects_from(&st.netns, port);
    let add = std::process::Command::new("iptables")
        .args(guard_rule_args("-I", &bridge_name))
        .output()
        .expect("iptables -I");
    assert!(
        add.status.success(),
        "{}",
        String::from_utf8_lossy(&add.stderr)
    );
    b.teardown(&st).await.expect("teardown");
    assert!(
        reached,
        "without the guard the attack should reach 127.0.0.1:{port} (route_localnet {}): \
         the test does not show what it guards against",
        localnet.trim()
    );
}

/// Taken by every test that sets a bridge up: the test above removes the guard rule
/// for a moment, and a setup meanwhile would put it back.
static GUARD: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
