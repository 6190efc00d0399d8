//! A task's environment as Nomad builds it (`client/taskenv`): the `NOMAD_*`
//! variables, the merged `meta` as `NOMAD_META_*`, the task's own `env` interpolated,
//! and the node's values (`${node.unique.id}`, `${attr.KEY}`, `${meta.KEY}`, ...) for
//! interpolating the task's `config`.
//!
//! Nomad's order, kept here:
//! 1. the node's values: `node.unique.id`, `node.unique.name`, `node.datacenter`,
//!    `node.region`, `node.class`, `attr.KEY` (fingerprinted attributes), `meta.KEY`
//!    (the agent's `meta`);
//! 2. the `NOMAD_*` variables of the allocation and task (directories as the task sees
//!    them: see [`TaskDirs`]; the ports of the allocation: see [`port_variables`]);
//! 3. `NOMAD_META_<key>` and `NOMAD_META_<KEY>` (upper-cased) of job < group < task
//!    `meta`, keys and values interpolated against 1 and 2;
//! 4. the task's `env`, values interpolated against 1 to 3 (keys are not), over 2 and
//!    3: a task may set a `NOMAD_*` variable itself, as in Nomad;
//! 5. keys of the port and meta families (`NOMAD_META_`, `NOMAD_PORT_`, ...) cleaned:
//!    characters other than letters, digits, `_` and `.` become `_`.
//!
//! The `config` is interpolated against the result (the task's variables first, then
//! the node's values). An `env` value may not refer to another `env` entry: Nomad
//! resolves those in an unspecified order, so nothing can rely on it.
//!
//! What interpolation accepts is in [`interpolate`]. In addition to Nomad's names,
//! `${node.meta.KEY}` and `${node.attr.KEY}` name the node's meta and attributes
//! (Nomad's config evaluation knows them; Drover's constraints use `node.meta`).

pub mod interpolate;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::Path;

use drover_plugin_sdk::FsIsolation;
use drover_server_api::{AllocatedPort, ClientAllocation, Task};

pub use interpolate::Syntax;

/// Prefixes of variables whose keys are cleaned (Nomad's `prefixesToClean`).
const CLEANED_PREFIXES: [&str; 5] = [
    "NOMAD_ADDR_",
    "NOMAD_IP_",
    "NOMAD_PORT_",
    "NOMAD_HOST_PORT_",
    "NOMAD_META_",
];

/// What a task may know of the node it runs on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeEnv {
    /// The node's id (`${node.unique.id}`).
    pub id: String,
    /// The node's name (`${node.unique.name}`).
    pub name: String,
    /// The node's datacenter (`NOMAD_DC`, `${node.datacenter}`).
    pub datacenter: String,
    /// The node's class (`${node.class}`): Drover nodes have none, so it is empty.
    pub class: String,
    /// Fingerprinted attributes (`${attr.KEY}`).
    pub attributes: BTreeMap<String, String>,
    /// The agent's `meta` (`${meta.KEY}`).
    pub meta: BTreeMap<String, String>,
}

/// The directories of a task as the task sees them (`NOMAD_ALLOC_DIR`,
/// `NOMAD_TASK_DIR`, `NOMAD_SECRETS_DIR`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskDirs {
    /// The allocation's shared directory.
    pub alloc: String,
    /// The task's `local/` directory (Nomad's `NOMAD_TASK_DIR` is `local/`, not the
    /// task directory itself).
    pub local: String,
    /// The task's `secrets/` directory.
    pub secrets: String,
}

impl TaskDirs {
    /// Where a driver with `isolation` puts the directories: the host paths for a
    /// driver without filesystem isolation (raw_exec), `/alloc`, `/local` and
    /// `/secrets` inside a chroot (exec, java) or an image (docker, qemu), as Drover's
    /// drivers mount them.
    pub fn for_driver(isolation: FsIsolation, shared_dir: &Path, task_dir: &Path) -> Self {
        match isolation {
            FsIsolation::None => TaskDirs {
                alloc: shared_dir.display().to_string(),
                local: task_dir.join("local").display().to_string(),
                secrets: task_dir.join("secrets").display().to_string(),
            },
            // Chroot, Image (and whatever isolation comes next: its tasks do not see
            // the host's paths either).
            _ => TaskDirs {
                alloc: "/alloc".to_owned(),
                local: "/local".to_owned(),
                secrets: "/secrets".to_owned(),
            },
        }
    }
}

/// A task's variables and the node's values: what `${...}` can refer to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskEnv {
    /// The task's environment.
    pub env: BTreeMap<String, String>,
    /// The node's values, by their names in references (`node.unique.id`,
    /// `attr.kernel.name`, `meta.rack`, ...).
    pub node: BTreeMap<String, String>,
    /// What interpolating the config may still add (the env took its part).
    budget: interpolate::Budget,
}

/// Nomad's `helper.CleanEnvVar(key, '_')`: byte by byte, so a non-ASCII character
/// becomes one `_` per byte.
fn clean_key(key: &str) -> String {
    key.bytes()
        .enumerate()
        .map(|(i, b)| {
            if b == b'_' || b == b'.' || b.is_ascii_alphabetic() || (i > 0 && b.is_ascii_digit()) {
                char::from(b)
            } else {
                '_'
            }
        })
        .collect()
}

/// The variables of an allocation's ports, Nomad's (`client/taskenv`'s `addPorts`),
/// for each port `<label>`:
/// - `NOMAD_PORT_<label>` and `NOMAD_ALLOC_PORT_<label>`: the port the task listens on,
///   the `to` of a mapped port (bridge mode, docker), else the node's port;
/// - `NOMAD_HOST_PORT_<label>`: the node's port;
/// - `NOMAD_IP_<label>` and `NOMAD_HOST_IP_<label>`: the node's address the port is on;
/// - `NOMAD_ADDR_<label>` and `NOMAD_HOST_ADDR_<label>`: that address and the node's
///   port (`[v6]:port` for an IPv6 address).
pub fn port_variables(ports: &[AllocatedPort]) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for p in ports {
        let label = &p.label;
        let host_port = p.value.to_string();
        let task_port = if p.to != 0 { p.to } else { p.value }.to_string();
        let addr = match p.host_ip.parse::<std::net::IpAddr>() {
            Ok(ip) => std::net::SocketAddr::new(ip, p.value).to_string(),
            Err(_) => format!("{}:{}", p.host_ip, p.value),
        };
        for (prefix, value) in [
            ("NOMAD_IP_", &p.host_ip),
            ("NOMAD_HOST_IP_", &p.host_ip),
            ("NOMAD_ADDR_", &addr),
            ("NOMAD_HOST_ADDR_", &addr),
            ("NOMAD_PORT_", &task_port),
            ("NOMAD_ALLOC_PORT_", &task_port),
            ("NOMAD_HOST_PORT_", &host_port),
        ] {
            env.insert(format!("{prefix}{label}"), value.clone());
        }
    }
    env
}

/// The node's values by reference name.
fn node_values(node: &NodeEnv, region: &str) -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    m.insert("node.unique.id".to_owned(), node.id.clone());
    m.insert("node.unique.name".to_owned(), node.name.clone());
    m.insert("node.datacenter".to_owned(), node.datacenter.clone());
    m.insert("node.region".to_owned(), region.to_owned());
    m.insert("node.class".to_owned(), node.class.clone());
    for (k, v) in &node.attributes {
        m.insert(format!("attr.{k}"), v.clone());
    }
    for (k, v) in &node.meta {
        m.insert(format!("meta.{k}"), v.clone());
    }
    m
}

/// The name a node value is kept under, for the `node.attr.` and `node.meta.` aliases.
fn node_key(name: &str) -> Cow<'_, str> {
    if let Some(k) = name.strip_prefix("node.attr.") {
        Cow::Owned(format!("attr.{k}"))
    } else if let Some(k) = name.strip_prefix("node.meta.") {
        Cow::Owned(format!("meta.{k}"))
    } else {
        Cow::Borrowed(name)
    }
}

impl TaskEnv {
    /// The environment of `task` of allocation `alloc` on `node`, with the task's
    /// directories `dirs`.
    ///
    /// # Errors
    /// The references of the task's meta and env would add more than
    /// [`interpolate::MAX_GROWTH_BYTES`].
    pub fn build(
        node: &NodeEnv,
        alloc: &ClientAllocation,
        task: &Task,
        dirs: &TaskDirs,
    ) -> Result<Self, interpolate::TooLarge> {
        let mut budget = interpolate::Budget::default();
        let a = &alloc.alloc;
        let node_vals = node_values(node, &alloc.region);
        let mut env = BTreeMap::new();
        let mut put = |k: &str, v: String| {
            env.insert(k.to_owned(), v);
        };
        put("NOMAD_ALLOC_DIR", dirs.alloc.clone());
        put("NOMAD_TASK_DIR", dirs.local.clone());
        put("NOMAD_SECRETS_DIR", dirs.secrets.clone());
        let r = task.resources;
        if r.memory_mb != 0 {
            put("NOMAD_MEMORY_LIMIT", r.memory_mb.to_string());
        }
        if r.memory_max_mb != 0 {
            put("NOMAD_MEMORY_MAX_LIMIT", r.memory_max_mb.to_string());
        }
        if r.cpu != 0 {
            put("NOMAD_CPU_LIMIT", r.cpu.to_string());
        }
        put("NOMAD_ALLOC_ID", a.id.clone());
        put("NOMAD_ALLOC_NAME", a.name.clone());
        put("NOMAD_ALLOC_INDEX", a.index.to_string());
        put("NOMAD_GROUP_NAME", a.group.clone());
        put("NOMAD_TASK_NAME", task.name.clone());
        // A Drover job's name is its id.
        put("NOMAD_JOB_ID", a.job_name.clone());
        put("NOMAD_JOB_NAME", a.job_name.clone());
        put("NOMAD_DC", node.datacenter.clone());
        put("NOMAD_NAMESPACE", a.namespace.clone());
        put("NOMAD_REGION", alloc.region.clone());
        for (k, v) in port_variables(&a.ports) {
            env.insert(k, v);
        }

        // Meta and env are interpolated against what is there before them, node
        // values first (Nomad's `ReplaceEnv(v, nodeAttrs, envMap)`).
        let before = env.clone();
        let lookup = |name: &str| -> Option<&str> {
            node_vals
                .get(node_key(name).as_ref())
                .or_else(|| before.get(name))
                .map(String::as_str)
        };
        let mut plain = |text: &str| {
            interpolate::interpolate(text, Syntax::Plain, lookup, &mut budget).map(Cow::into_owned)
        };
        let mut meta: BTreeMap<&str, &str> = BTreeMap::new();
        for (k, v) in alloc
            .job_meta
            .iter()
            .chain(&alloc.group.meta)
            .chain(&task.meta)
        {
            meta.insert(k, v);
        }
        for (k, v) in meta {
            let (k, v) = (plain(k)?, plain(v)?);
            env.insert(format!("NOMAD_META_{}", k.to_uppercase()), v.clone());
            env.insert(format!("NOMAD_META_{k}"), v);
        }
        let before_env = env.clone();
        let lookup = |name: &str| -> Option<&str> {
            node_vals
                .get(node_key(name).as_ref())
                .or_else(|| before_env.get(name))
                .map(String::as_str)
        };
        for (k, v) in &task.env {
            let v = interpolate::interpolate(v, Syntax::Plain, lookup, &mut budget)?.into_owned();
            env.insert(k.clone(), v);
        }

        let env = env
            .into_iter()
            .map(|(k, v)| {
                if CLEANED_PREFIXES.iter().any(|p| k.starts_with(p)) {
                    (clean_key(&k), v)
                } else {
                    (k, v)
                }
            })
            .collect();
        Ok(TaskEnv {
            env,
            node: node_vals,
            budget,
        })
    }

    /// What `${name}` stands for: a task variable, else a node value.
    pub fn lookup(&self, name: &str) -> Option<&str> {
        self.env
            .get(name)
            .or_else(|| self.node.get(node_key(name).as_ref()))
            .map(String::as_str)
    }

    /// `text` with the references this environment knows replaced.
    ///
    /// # Errors
    /// The references would add more than what is left of the task's budget.
    pub fn interpolate<'t>(
        &mut self,
        text: &'t str,
        syntax: Syntax,
    ) -> Result<Cow<'t, str>, interpolate::TooLarge> {
        let mut budget = self.budget.clone();
        let out = interpolate::interpolate(text, syntax, |n| self.lookup(n), &mut budget)?;
        self.budget = budget;
        Ok(out)
    }

    /// Every string of a task's `config`, nested or not, interpolated in place.
    ///
    /// # Errors
    /// The references would add more than what is left of the task's budget.
    pub fn interpolate_config(
        &mut self,
        config: &mut serde_json::Value,
    ) -> Result<usize, interpolate::TooLarge> {
        let mut budget = self.budget.clone();
        let n = interpolate::interpolate_json(config, &|n| self.lookup(n), &mut budget)?;
        self.budget = budget;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_server_api::{
        AllocResources, Allocation, ClientStatus, DesiredStatus, JobType, TaskGroup, TaskResources,
    };
    use std::path::PathBuf;

    fn node() -> NodeEnv {
        NodeEnv {
            id: "node-uuid".into(),
            name: "n1".into(),
            datacenter: "eu-west".into(),
            class: String::new(),
            attributes: BTreeMap::from([("kernel.name".into(), "linux".into())]),
            meta: BTreeMap::from([("rack".into(), "r7".into())]),
        }
    }

    fn task() -> Task {
        Task {
            devices: Default::default(),
            volume_mounts: Default::default(),
            services: Default::default(),
            name: "web".into(),
            driver: "raw_exec".into(),
            config: serde_json::Value::Null,
            env: BTreeMap::new(),
            meta: BTreeMap::new(),
            kill_signal: None,
            kill_timeout: None,
            restart: None,
            resources: TaskResources {
                cpu: 250,
                memory_mb: 128,
                memory_max_mb: 0,
            },
            logs: None,
            lifecycle: None,
            artifacts: Vec::new(),
            templates: Vec::new(),
            identity: None,
        }
    }

    fn alloc(task: &Task) -> ClientAllocation {
        ClientAllocation {
            update: Default::default(),
            alloc: Allocation {
                task_devices: Default::default(),
                namespace: "default".into(),
                deployment_id: Default::default(),
                deployment_status: Default::default(),
                ports: Default::default(),
                id: "alloc-uuid".into(),
                name: "shop.front[2]".into(),
                index: 2,
                job_name: "shop".into(),
                job_version: 0,
                group: "front".into(),
                node_id: "node-uuid".into(),
                node_name: "n1".into(),
                resources: AllocResources::default(),
                desired_status: DesiredStatus::Run,
                desired_description: String::new(),
                client_status: ClientStatus::Pending,
                client_description: String::new(),
                task_states: BTreeMap::new(),
                eval_id: "e".into(),
                previous_allocation: None,
                next_allocation: None,
                reschedule_events: Vec::new(),
                create_index: 1,
                modify_index: 1,
                alloc_modify_index: 1,
                create_time: 0,
                modify_time: 0,
            },
            job_type: JobType::Service,
            group: TaskGroup {
                volumes: Default::default(),
                update: Default::default(),
                network: Default::default(),
                services: Default::default(),
                name: "front".into(),
                count: 3,
                constraints: Vec::new(),
                meta: BTreeMap::new(),
                tasks: vec![task.clone()],
                reschedule: None,
            },
            job_meta: BTreeMap::new(),
            region: "europe".into(),
            identities: BTreeMap::new(),
            csi_volumes: BTreeMap::new(),
        }
    }

    fn host_dirs() -> TaskDirs {
        TaskDirs::for_driver(
            FsIsolation::None,
            Path::new("/data/alloc/alloc-uuid/alloc"),
            Path::new("/data/alloc/t1"),
        )
    }

    #[test]
    fn nomad_variables_of_an_allocation() {
        let t = task();
        let e = TaskEnv::build(&node(), &alloc(&t), &t, &host_dirs()).expect("within the budget");
        let want = [
            ("NOMAD_ALLOC_ID", "alloc-uuid"),
            ("NOMAD_ALLOC_NAME", "shop.front[2]"),
            ("NOMAD_ALLOC_INDEX", "2"),
            ("NOMAD_ALLOC_DIR", "/data/alloc/alloc-uuid/alloc"),
            ("NOMAD_TASK_DIR", "/data/alloc/t1/local"),
            ("NOMAD_SECRETS_DIR", "/data/alloc/t1/secrets"),
            ("NOMAD_TASK_NAME", "web"),
            ("NOMAD_GROUP_NAME", "front"),
            ("NOMAD_JOB_ID", "shop"),
            ("NOMAD_JOB_NAME", "shop"),
            ("NOMAD_NAMESPACE", "default"),
            ("NOMAD_DC", "eu-west"),
            ("NOMAD_REGION", "europe"),
            ("NOMAD_CPU_LIMIT", "250"),
            ("NOMAD_MEMORY_LIMIT", "128"),
        ];
        for (k, v) in want {
            assert_eq!(e.env.get(k).map(String::as_str), Some(v), "{k}");
        }
        assert_eq!(e.env.len(), want.len(), "{:?}", e.env);
        assert!(!e.env.contains_key("NOMAD_MEMORY_MAX_LIMIT"));

        let mut t = task();
        t.resources.memory_max_mb = 512;
        let e = TaskEnv::build(&node(), &alloc(&t), &t, &host_dirs()).expect("within the budget");
        assert_eq!(e.env["NOMAD_MEMORY_MAX_LIMIT"], "512");
    }

    #[test]
    fn directories_as_an_isolated_task_sees_them() {
        let shared = PathBuf::from("/data/alloc/a/alloc");
        let dir = PathBuf::from("/data/alloc/t1");
        for iso in [FsIsolation::Chroot, FsIsolation::Image] {
            let d = TaskDirs::for_driver(iso, &shared, &dir);
            assert_eq!(
                (d.alloc.as_str(), d.local.as_str(), d.secrets.as_str()),
                ("/alloc", "/local", "/secrets")
            );
        }
    }

    #[test]
    fn meta_is_merged_job_group_task_raw_and_upper_cased() {
        let mut t = task();
        t.meta = BTreeMap::from([
            ("tier".into(), "task".into()),
            ("only-task".into(), "t".into()),
        ]);
        let mut a = alloc(&t);
        a.job_meta = BTreeMap::from([
            ("tier".into(), "job".into()),
            ("owner".into(), "ops".into()),
            (
                "where".into(),
                "${node.datacenter}/${NOMAD_ALLOC_INDEX}".into(),
            ),
        ]);
        a.group.meta = BTreeMap::from([
            ("tier".into(), "group".into()),
            ("owner".into(), "web-team".into()),
        ]);
        let e = TaskEnv::build(&node(), &a, &t, &host_dirs()).expect("within the budget");
        assert_eq!(e.env["NOMAD_META_tier"], "task");
        assert_eq!(e.env["NOMAD_META_TIER"], "task");
        assert_eq!(e.env["NOMAD_META_owner"], "web-team");
        assert_eq!(e.env["NOMAD_META_OWNER"], "web-team");
        // Interpolated; keys cleaned ('-' is not kept).
        assert_eq!(e.env["NOMAD_META_where"], "eu-west/2");
        assert_eq!(e.env["NOMAD_META_only_task"], "t");
        assert_eq!(e.env["NOMAD_META_ONLY_TASK"], "t");
        assert!(!e.env.keys().any(|k| k.contains('-')), "{:?}", e.env);
    }

    #[test]
    fn env_values_are_interpolated_and_may_override_nomad_variables() {
        let mut t = task();
        t.env = BTreeMap::from([
            ("INDEX".into(), "i-${NOMAD_ALLOC_INDEX}".into()),
            ("KERNEL".into(), "${attr.kernel.name}".into()),
            ("RACK".into(), "${meta.rack} ${node.meta.rack}".into()),
            ("WHO".into(), "${node.unique.name}@${node.region}".into()),
            ("UNKNOWN".into(), "${attr.nope} ${NOPE}".into()),
            ("OTHER".into(), "${INDEX}".into()),
            ("NOMAD_DC".into(), "mine".into()),
            (
                "${NOMAD_ALLOC_INDEX}".into(),
                "keys are not interpolated".into(),
            ),
        ]);
        let e = TaskEnv::build(&node(), &alloc(&t), &t, &host_dirs()).expect("within the budget");
        assert_eq!(e.env["INDEX"], "i-2");
        assert_eq!(e.env["KERNEL"], "linux");
        assert_eq!(e.env["RACK"], "r7 r7");
        assert_eq!(e.env["WHO"], "n1@europe");
        assert_eq!(e.env["UNKNOWN"], "${attr.nope} ${NOPE}");
        // Not another env entry (Nomad's order for those is unspecified).
        assert_eq!(e.env["OTHER"], "${INDEX}");
        assert_eq!(e.env["NOMAD_DC"], "mine");
        assert!(e.env.contains_key("${NOMAD_ALLOC_INDEX}"));
    }

    #[test]
    fn config_sees_the_final_env_then_the_node() {
        let mut t = task();
        t.env = BTreeMap::from([("PORT".into(), "80${NOMAD_ALLOC_INDEX}".into())]);
        let mut a = alloc(&t);
        a.job_meta = BTreeMap::from([("color".into(), "blue".into())]);
        let mut e = TaskEnv::build(&node(), &a, &t, &host_dirs()).expect("within the budget");
        let mut config = serde_json::json!({
            "command": "${NOMAD_TASK_DIR}/run",
            "args": [
                "--port=${PORT}",
                "--color=${NOMAD_META_color}",
                "--node=${node.unique.id}",
                "--os=${attr.kernel.name}",
                "--os2=${node.attr.kernel.name}",
                "--dc=${node.datacenter}",
                "--class=[${node.class}]",
                "--env=${env[\"NOMAD_ALLOC_ID\"]}",
                "--left=${nope.nope}",
            ],
        });
        e.interpolate_config(&mut config)
            .expect("within the budget");
        assert_eq!(
            config,
            serde_json::json!({
                "command": "/data/alloc/t1/local/run",
                "args": [
                    "--port=802",
                    "--color=blue",
                    "--node=node-uuid",
                    "--os=linux",
                    "--os2=linux",
                    "--dc=eu-west",
                    "--class=[]",
                    "--env=alloc-uuid",
                    "--left=${nope.nope}",
                ],
            })
        );
    }

    #[test]
    fn keys_are_cleaned_like_nomads() {
        assert_eq!(clean_key("NOMAD_META_a-b.c"), "NOMAD_META_a_b.c");
        assert_eq!(clean_key("NOMAD_META_ün"), "NOMAD_META___n");
        assert_eq!(clean_key("1abc"), "_abc");
    }

    fn port(label: &str, value: u16, to: u16) -> AllocatedPort {
        AllocatedPort {
            label: label.into(),
            value,
            to,
            host_ip: "127.0.0.1".into(),
        }
    }

    /// Nomad's port variables: the task's port is `to` when the port is mapped, the
    /// node's port otherwise; the host variables always carry the node's side.
    #[test]
    fn port_variables_of_host_and_mapped_ports() {
        let t = task();
        let mut a = alloc(&t);
        a.alloc.ports = vec![port("http", 23456, 23456), port("db", 24000, 5432)];
        let e = TaskEnv::build(&node(), &a, &t, &host_dirs()).expect("within the budget");
        for (k, v) in [
            ("NOMAD_PORT_http", "23456"),
            ("NOMAD_ALLOC_PORT_http", "23456"),
            ("NOMAD_HOST_PORT_http", "23456"),
            ("NOMAD_IP_http", "127.0.0.1"),
            ("NOMAD_HOST_IP_http", "127.0.0.1"),
            ("NOMAD_ADDR_http", "127.0.0.1:23456"),
            ("NOMAD_HOST_ADDR_http", "127.0.0.1:23456"),
            ("NOMAD_PORT_db", "5432"),
            ("NOMAD_ALLOC_PORT_db", "5432"),
            ("NOMAD_HOST_PORT_db", "24000"),
            ("NOMAD_IP_db", "127.0.0.1"),
            ("NOMAD_ADDR_db", "127.0.0.1:24000"),
            ("NOMAD_HOST_ADDR_db", "127.0.0.1:24000"),
        ] {
            assert_eq!(e.env.get(k).map(String::as_str), Some(v), "{k}");
        }
        // A port with no `to` at all is the node's port.
        let mut p = port("x", 25000, 0);
        p.host_ip = "::1".into();
        let vars = port_variables(&[p]);
        assert_eq!(vars["NOMAD_PORT_x"], "25000");
        assert_eq!(vars["NOMAD_ADDR_x"], "[::1]:25000");
    }

    /// `${NOMAD_PORT_http}` and the rest work in the task's config and env, as the
    /// acceptance's `python3 -m http.server ${NOMAD_PORT_http} --bind ${NOMAD_IP_http}`
    /// needs; a label with a character Nomad cleans is cleaned in the key.
    #[test]
    fn port_variables_are_interpolated_in_config_and_env() {
        let mut t = task();
        t.env = BTreeMap::from([("LISTEN".into(), "${NOMAD_ADDR_http}".into())]);
        let mut a = alloc(&t);
        a.alloc.ports = vec![port("http", 23456, 23456), port("ad-min", 23457, 9000)];
        let mut e = TaskEnv::build(&node(), &a, &t, &host_dirs()).expect("within the budget");
        assert_eq!(e.env["LISTEN"], "127.0.0.1:23456");
        assert_eq!(e.env["NOMAD_PORT_ad_min"], "9000");
        assert_eq!(e.env["NOMAD_HOST_PORT_ad_min"], "23457");
        let mut config = serde_json::json!({
            "command": "python3",
            "args": ["-m", "http.server", "${NOMAD_PORT_http}", "--bind", "${NOMAD_IP_http}"],
        });
        e.interpolate_config(&mut config)
            .expect("within the budget");
        assert_eq!(
            config["args"],
            serde_json::json!(["-m", "http.server", "23456", "--bind", "127.0.0.1"])
        );
    }
}
