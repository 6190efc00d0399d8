//! What the node tells the servers about itself: host attributes (Nomad's names),
//! resources, and every driver's fingerprint.

use std::collections::BTreeMap;

use drover_api::PluginState;
use drover_server_api::{DriverInfo, NodeResources};

use crate::plugins::catalog::Catalog;

/// Used when neither sysfs nor /proc/cpuinfo tells the CPU's frequency (some VMs and
/// ARM boards): the node's CPU capacity is then cores × this.
pub const FALLBACK_CPU_MHZ: u64 = 1000;

/// The host's attributes and resources, read once at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostFacts {
    /// `os.name`, `kernel.name`, `kernel.version`, `cpu.arch`, `cpu.numcores`,
    /// `cpu.frequency`, `cpu.totalcompute`, `memory.totalbytes`, `unique.hostname`...
    pub attributes: BTreeMap<String, String>,
    /// cores × MHz, memory in MiB.
    pub resources: NodeResources,
    /// The host name (the node's default name).
    pub hostname: String,
}

/// Nomad's (Go's) architecture names, which job constraints are written against.
fn go_arch(arch: &str) -> &str {
    match arch {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" | "i686" | "i386" => "386",
        "powerpc64" => "ppc64",
        "powerpc64le" => "ppc64le",
        "arm" | "armv7l" => "arm",
        other => other,
    }
}

/// The highest "cpu MHz" of /proc/cpuinfo, rounded.
pub fn cpuinfo_mhz(text: &str) -> Option<u64> {
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == "cpu MHz").then(|| v.trim().parse::<f64>().ok())?
        })
        .filter(|mhz| mhz.is_finite() && *mhz > 0.0)
        .map(|mhz| mhz.round() as u64)
        .max()
}

/// MemTotal of /proc/meminfo, in bytes.
pub fn meminfo_total_bytes(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let mut parts = line["MemTotal:".len()..].split_whitespace();
    let n: u64 = parts.next()?.parse().ok()?;
    match parts.next() {
        Some("kB") | None => n.checked_mul(1024),
        Some(_) => None,
    }
}

/// The CPU's frequency in MHz and where it came from: the maximum of cpufreq (sysfs),
/// else the highest current "cpu MHz" of /proc/cpuinfo, else [`FALLBACK_CPU_MHZ`].
fn cpu_mhz() -> (u64, &'static str) {
    let sysfs = std::fs::read_to_string("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")
        .ok()
        .and_then(|t| t.trim().parse::<u64>().ok())
        .map(|khz| khz / 1000)
        .filter(|mhz| *mhz > 0);
    if let Some(mhz) = sysfs {
        return (mhz, "cpufreq");
    }
    if let Some(mhz) = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .as_deref()
        .and_then(cpuinfo_mhz)
    {
        return (mhz, "cpuinfo");
    }
    (FALLBACK_CPU_MHZ, "fallback")
}

fn os_release() -> BTreeMap<String, String> {
    let text = std::fs::read_to_string("/etc/os-release")
        .or_else(|_| std::fs::read_to_string("/usr/lib/os-release"))
        .unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once('=')?;
            Some((k.trim().to_owned(), v.trim().trim_matches('"').to_owned()))
        })
        .collect()
}

/// Read the host's facts.
pub fn host() -> HostFacts {
    let uname = rustix::system::uname();
    let text = |c: &std::ffi::CStr| c.to_string_lossy().into_owned();
    let hostname = text(uname.nodename());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    let (mhz, source) = cpu_mhz();
    if source == "fallback" {
        tracing::warn!(
            mhz = FALLBACK_CPU_MHZ,
            "cannot read the CPU frequency (no cpufreq in sysfs, no \"cpu MHz\" in \
             /proc/cpuinfo); assuming {FALLBACK_CPU_MHZ} MHz per core for the node's CPU \
             capacity"
        );
    }
    let memory = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .as_deref()
        .and_then(meminfo_total_bytes)
        .unwrap_or(0);
    let os = os_release();
    let mut a = BTreeMap::new();
    a.insert(
        "os.name".to_owned(),
        os.get("ID")
            .cloned()
            .unwrap_or_else(|| std::env::consts::OS.to_owned()),
    );
    if let Some(v) = os.get("VERSION_ID") {
        a.insert("os.version".to_owned(), v.clone());
    }
    a.insert(
        "kernel.name".to_owned(),
        text(uname.sysname()).to_lowercase(),
    );
    a.insert("kernel.version".to_owned(), text(uname.release()));
    a.insert(
        "cpu.arch".to_owned(),
        go_arch(&text(uname.machine())).to_owned(),
    );
    a.insert("cpu.numcores".to_owned(), cores.to_string());
    a.insert("cpu.frequency".to_owned(), mhz.to_string());
    a.insert("cpu.totalcompute".to_owned(), (cores * mhz).to_string());
    a.insert("memory.totalbytes".to_owned(), memory.to_string());
    a.insert("unique.hostname".to_owned(), hostname.clone());
    HostFacts {
        attributes: a,
        resources: NodeResources {
            cpu: cores * mhz,
            memory_mb: memory / (1024 * 1024),
        },
        hostname,
    }
}

/// Every loaded driver's fingerprint. `detected`: the plugin is loaded and its
/// fingerprint did not say it cannot run here (Nomad's "undetected", e.g. docker
/// without a daemon); `healthy`: its last fingerprint was healthy. Attribute keys
/// lose their `driver.<name>.` prefix (`${driver.docker.version}` in a constraint is
/// `attributes["version"]` of driver `docker`).
pub fn drivers(catalog: &Catalog) -> BTreeMap<String, DriverInfo> {
    let mut out = BTreeMap::new();
    for name in catalog.names() {
        let Some(plugin) = catalog.get(&name) else {
            continue;
        };
        if plugin.kind() != drover_api::PluginKind::Driver {
            continue;
        }
        let (state, reason) = plugin.state();
        let healthy = state == PluginState::Healthy;
        let prefix = format!("driver.{name}.");
        let attributes = plugin
            .attributes()
            .into_iter()
            .map(|(k, v)| match k.strip_prefix(&prefix) {
                Some(short) => (short.to_owned(), v),
                None => (k, v),
            })
            .collect();
        out.insert(
            name,
            DriverInfo {
                detected: state != PluginState::Undetected && state != PluginState::Skipped,
                healthy,
                // Only when it matters: a healthy driver's description changing
                // ("3 tasks running") must not re-register the node.
                health_description: if healthy { String::new() } else { reason },
                attributes,
            },
        );
    }
    out
}

/// Every device group the loaded device plugins fingerprinted, in a stable order
/// (by `vendor/type/name`, instances by id) so that an unchanged fingerprint never
/// re-registers the node. Two plugins reporting the same group: the first plugin's
/// (by name) is kept, the other's logged.
pub fn devices(catalog: &Catalog) -> Vec<drover_server_api::NodeDeviceGroup> {
    let mut out: BTreeMap<String, drover_server_api::NodeDeviceGroup> = BTreeMap::new();
    for plugin in catalog.device_plugins() {
        for g in plugin.devices() {
            let group = node_device_group(g);
            let id = group.id();
            if out.contains_key(&id) {
                tracing::warn!(plugin = %plugin.name, device = %id, "device group reported by two plugins; keeping the first");
                continue;
            }
            out.insert(id, group);
        }
    }
    out.into_values().collect()
}

/// A plugin's device group as the node registers it (instances by id).
pub fn node_device_group(
    g: drover_plugin_sdk::device::DeviceGroup,
) -> drover_server_api::NodeDeviceGroup {
    let mut instances: Vec<_> = g
        .instances
        .into_iter()
        .map(|i| drover_server_api::NodeDeviceInstance {
            id: i.id,
            healthy: i.healthy,
            health_description: i.health_description,
        })
        .collect();
    instances.sort_by(|a, b| a.id.cmp(&b.id));
    drover_server_api::NodeDeviceGroup {
        vendor: g.vendor,
        device_type: g.device_type,
        name: g.name,
        instances,
        attributes: g.attributes,
    }
}

/// Check a device plugin's fingerprint before it is kept (the bounds the server
/// checks again when the node registers; ids without `/` or `,`).
pub fn check_plugin_devices(
    groups: &[drover_plugin_sdk::device::DeviceGroup],
) -> Result<(), String> {
    let converted: Vec<_> = groups.iter().cloned().map(node_device_group).collect();
    drover_server_api::devices::check_device_groups(&converted)
}

/// The device plugin that reported device group `vendor/type/name`.
pub fn device_plugin_of(
    catalog: &Catalog,
    vendor: &str,
    device_type: &str,
    name: &str,
) -> Option<std::sync::Arc<crate::plugins::catalog::LoadedPlugin>> {
    catalog.device_plugins().into_iter().find(|p| {
        p.devices()
            .iter()
            .any(|g| g.vendor == vendor && g.device_type == device_type && g.name == name)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plugins_device_fingerprint_is_bounded_before_it_is_kept() {
        use drover_plugin_sdk::device::{DeviceGroup, DeviceInstance};
        let ok = DeviceGroup::new("drover", "test", "node")
            .with_instances([DeviceInstance::healthy("b"), DeviceInstance::healthy("a")]);
        assert!(check_plugin_devices(std::slice::from_ref(&ok)).is_ok());
        // Instances are registered in id order.
        let ids: Vec<String> = node_device_group(ok.clone())
            .instances
            .into_iter()
            .map(|i| i.id)
            .collect();
        assert_eq!(ids, ["a", "b"]);
        for bad_id in ["a,b", "a/b", ""] {
            let g = ok.clone().with_instances([DeviceInstance::healthy(bad_id)]);
            let e = check_plugin_devices(&[g]).unwrap_err();
            assert!(e.contains("devices[0].instances[0].id"), "{bad_id:?}: {e}");
        }
        let too_many = ok.clone().with_instances(
            (0..=drover_server_api::devices::MAX_DEVICE_INSTANCES)
                .map(|i| DeviceInstance::healthy(format!("i{i}"))),
        );
        assert!(check_plugin_devices(&[too_many]).is_err());
        let groups = vec![ok.clone(); drover_server_api::devices::MAX_DEVICE_GROUPS + 1];
        assert!(check_plugin_devices(&groups).is_err());
        let mut attrs = ok.clone();
        for i in 0..=drover_server_api::devices::MAX_DEVICE_ATTRIBUTES {
            attrs = attrs.with_attribute(format!("k{i}"), "v");
        }
        assert!(check_plugin_devices(&[attrs]).is_err());
        let long = ok.with_attribute(
            "k",
            "x".repeat(drover_server_api::devices::MAX_DEVICE_TEXT_BYTES + 1),
        );
        assert!(check_plugin_devices(&[long]).is_err());
    }

    #[test]
    fn this_hosts_facts_are_sane() {
        let h = host();
        let cores = std::thread::available_parallelism().unwrap().get();
        assert_eq!(h.attributes["cpu.numcores"], cores.to_string());
        let mhz: u64 = h.attributes["cpu.frequency"].parse().unwrap();
        assert!(mhz > 0);
        assert_eq!(h.resources.cpu, cores as u64 * mhz);
        let mem: u64 = h.attributes["memory.totalbytes"].parse().unwrap();
        assert!(mem > 0);
        assert_eq!(h.resources.memory_mb, mem >> 20);
        assert_eq!(h.attributes["kernel.name"], "linux");
        assert!(!h.attributes["kernel.version"].is_empty());
        assert!(!h.attributes["os.name"].is_empty());
        if cfg!(target_arch = "x86_64") {
            assert_eq!(h.attributes["cpu.arch"], "amd64");
        }
        assert_eq!(h.attributes["unique.hostname"], h.hostname);
        assert!(!h.hostname.is_empty());
    }

    #[test]
    fn proc_files_parse() {
        let cpuinfo =
            "processor\t: 0\ncpu MHz\t\t: 2399.998\nprocessor\t: 1\ncpu MHz\t\t: 3100.4\n";
        assert_eq!(cpuinfo_mhz(cpuinfo), Some(3100));
        assert_eq!(cpuinfo_mhz("processor : 0\n"), None);
        assert_eq!(cpuinfo_mhz("cpu MHz : nan\n"), None);
        let meminfo = "MemTotal:       16318412 kB\nMemFree:         1 kB\n";
        assert_eq!(meminfo_total_bytes(meminfo), Some(16318412 * 1024));
        assert_eq!(meminfo_total_bytes("MemFree: 1 kB\n"), None);
    }

    #[test]
    fn an_empty_catalog_has_no_drivers() {
        assert!(drivers(&Catalog::default()).is_empty());
    }
}
