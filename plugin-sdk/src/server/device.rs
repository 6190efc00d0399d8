//! A [`DevicePlugin`] served over Nomad's device protocol: what
//! [`crate::server::serve_device`] serves. Nomad's `BasePlugin` (type `device`, the
//! config's JSON Schema as an hclspec, msgpack configs) and
//! `hashicorp.nomad.plugins.device.DevicePlugin` (`Fingerprint`, `Reserve`, `Stats`),
//! which a Drover agent and a Nomad agent both load.

use std::sync::Arc;
use std::time::{Duration, Instant};

use drover_proto::nomad::{base as nb, device as ndev, structs as ns};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use super::nomad::{NomadBase, NomadBased};
use super::{BoxStream, FINGERPRINT_HEARTBEAT, MAX_MESSAGE_SIZE, contained};
use crate::device::{DeviceGroup, DevicePlugin, DeviceStats, Reservation};
use crate::types::AgentInfo;

/// The device plugin API versions a Nomad 1.0 agent accepts (its loader's
/// `device.ApiVersion010`), which a Drover agent accepts too.
pub(super) const NOMAD_DEVICE_API_VERSIONS: &[&str] = &["v0.1.0"];

/// Add Nomad's BasePlugin and DevicePlugin services over `plugin` to `router`.
pub(super) fn add_services<P: DevicePlugin>(
    router: tonic::transport::server::Router,
    plugin: Arc<P>,
    stop: CancellationToken,
) -> tonic::transport::server::Router {
    router
        .add_service(
            nb::base_plugin_server::BasePluginServer::new(NomadBase::<_, AsDevice>::new(
                plugin.clone(),
            ))
            .max_decoding_message_size(MAX_MESSAGE_SIZE)
            .max_encoding_message_size(MAX_MESSAGE_SIZE),
        )
        .add_service(
            ndev::device_plugin_server::DevicePluginServer::new(DeviceService { plugin, stop })
                .max_decoding_message_size(MAX_MESSAGE_SIZE)
                .max_encoding_message_size(MAX_MESSAGE_SIZE),
        )
}

/// [`NomadBased`] for a [`DevicePlugin`].
pub(super) enum AsDevice {}

impl<P: DevicePlugin> NomadBased<AsDevice> for P {
    type Config = P::Config;
    const TYPE: nb::PluginType = nb::PluginType::Device;
    const API_VERSIONS: &'static [&'static str] = NOMAD_DEVICE_API_VERSIONS;
    fn info(&self) -> crate::PluginInfo {
        DevicePlugin::info(self)
    }
    fn set_config(
        &self,
        config: Self::Config,
        agent: AgentInfo,
    ) -> impl std::future::Future<Output = Result<(), crate::DriverError>> + Send {
        DevicePlugin::set_config(self, config, agent)
    }
}

struct DeviceService<P> {
    plugin: Arc<P>,
    stop: CancellationToken,
}

/// A group's attribute text as Nomad's typed attribute: `true`/`false` booleans, an
/// integer or a float with an optional unit after a space (`11 GiB`), else a string.
fn device_attribute(text: &str) -> ns::Attribute {
    use ns::attribute::Value;
    let (number, unit) = match text.split_once(' ') {
        Some((n, u)) if !u.is_empty() && !u.contains(' ') => (n, u),
        _ => (text, ""),
    };
    let value = if let Ok(i) = number.parse::<i64>() {
        Some(Value::IntVal(i))
    } else if let Ok(f) = number.parse::<f64>()
        && f.is_finite()
    {
        Some(Value::FloatVal(f))
    } else {
        None
    };
    match (value, text) {
        (Some(v), _) => ns::Attribute {
            value: Some(v),
            unit: unit.to_owned(),
        },
        (None, "true") => ns::Attribute {
            value: Some(Value::BoolVal(true)),
            unit: String::new(),
        },
        (None, "false") => ns::Attribute {
            value: Some(Value::BoolVal(false)),
            unit: String::new(),
        },
        (None, _) => ns::Attribute {
            value: Some(Value::StringVal(text.to_owned())),
            unit: String::new(),
        },
    }
}

fn nomad_group(g: DeviceGroup) -> ndev::DeviceGroup {
    ndev::DeviceGroup {
        vendor: g.vendor,
        device_type: g.device_type,
        device_name: g.name,
        devices: g
            .instances
            .into_iter()
            .map(|i| ndev::DetectedDevice {
                id: i.id,
                healthy: i.healthy,
                health_description: i.health_description,
                hw_locality: None,
            })
            .collect(),
        attributes: g
            .attributes
            .iter()
            .map(|(k, v)| (k.clone(), device_attribute(v)))
            .collect(),
    }
}

fn nomad_reservation(r: Reservation) -> ndev::ContainerReservation {
    ndev::ContainerReservation {
        envs: r.envs.into_iter().collect(),
        mounts: r
            .mounts
            .into_iter()
            .map(|m| ndev::Mount {
                task_path: m.task_path,
                host_path: m.host_path,
                read_only: m.read_only,
            })
            .collect(),
        devices: r
            .devices
            .into_iter()
            .map(|d| ndev::DeviceSpec {
                task_path: d.task_path,
                host_path: d.host_path,
                permissions: d.permissions,
            })
            .collect(),
    }
}

fn nomad_stats(stats: Vec<DeviceStats>) -> ndev::StatsResponse {
    let mut groups: Vec<ndev::DeviceGroupStats> = Vec::new();
    let now = crate::types::to_timestamp(std::time::SystemTime::now());
    for s in stats {
        let at = match groups
            .iter()
            .position(|g| g.vendor == s.vendor && g.r#type == s.device_type && g.name == s.name)
        {
            Some(at) => at,
            None => {
                groups.push(ndev::DeviceGroupStats {
                    vendor: s.vendor.clone(),
                    r#type: s.device_type.clone(),
                    name: s.name.clone(),
                    instance_stats: Default::default(),
                });
                groups.len() - 1
            }
        };
        groups[at].instance_stats.insert(
            s.instance,
            ndev::DeviceStats {
                summary: Some(ns::StatValue {
                    float_numerator_val: Some(s.value),
                    unit: s.unit,
                    ..Default::default()
                }),
                stats: None,
                timestamp: Some(now),
            },
        );
    }
    ndev::StatsResponse { groups }
}

#[tonic::async_trait]
impl<P: DevicePlugin> ndev::device_plugin_server::DevicePlugin for DeviceService<P> {
    type FingerprintStream = BoxStream<ndev::FingerprintResponse>;
    type StatsStream = BoxStream<ndev::StatsResponse>;

    async fn fingerprint(
        &self,
        _: Request<ndev::FingerprintRequest>,
    ) -> Result<Response<Self::FingerprintStream>, Status> {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let plugin = self.plugin.clone();
        let stop = self.stop.clone();
        tokio::spawn(async move {
            let mut last: Option<Vec<DeviceGroup>> = None;
            let mut last_sent = Instant::now();
            loop {
                let groups = match contained("Fingerprint", plugin.fingerprint()).await {
                    Ok(Ok(groups)) => groups,
                    Ok(Err(e)) => {
                        let _ = tx.send(Err(Status::from(e))).await;
                        return;
                    }
                    Err(status) => {
                        let _ = tx.send(Err(status)).await;
                        return;
                    }
                };
                if last.as_ref() != Some(&groups) || last_sent.elapsed() >= FINGERPRINT_HEARTBEAT {
                    let msg = ndev::FingerprintResponse {
                        device_group: groups.iter().cloned().map(nomad_group).collect(),
                    };
                    if tx.send(Ok(msg)).await.is_err() {
                        return;
                    }
                    last_sent = Instant::now();
                    last = Some(groups);
                }
                tokio::select! {
                    () = tokio::time::sleep(plugin.fingerprint_interval()) => {}
                    () = tx.closed() => return,
                    () = stop.cancelled() => return,
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn reserve(
        &self,
        req: Request<ndev::ReserveRequest>,
    ) -> Result<Response<ndev::ReserveResponse>, Status> {
        let ids = req.into_inner().device_ids;
        let r = contained("Reserve", self.plugin.reserve(ids)).await??;
        Ok(Response::new(ndev::ReserveResponse {
            container_res: Some(nomad_reservation(r)),
        }))
    }

    async fn stats(
        &self,
        req: Request<ndev::StatsRequest>,
    ) -> Result<Response<Self::StatsStream>, Status> {
        let interval = req
            .into_inner()
            .collection_interval
            .and_then(|d| Duration::try_from(d).ok())
            .unwrap_or(Duration::from_secs(1))
            .max(Duration::from_millis(100));
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let plugin = self.plugin.clone();
        let stop = self.stop.clone();
        tokio::spawn(async move {
            loop {
                let msg = match contained("Stats", plugin.stats()).await {
                    Ok(Ok(s)) => Ok(nomad_stats(s)),
                    Ok(Err(e)) => Err(Status::from(e)),
                    Err(status) => Err(status),
                };
                let failed = msg.is_err();
                if tx.send(msg).await.is_err() || failed {
                    return;
                }
                tokio::select! {
                    () = tokio::time::sleep(interval) => {}
                    () = tx.closed() => return,
                    () = stop.cancelled() => return,
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{DeviceInstance, DeviceNode};

    #[test]
    fn attributes_with_units_are_typed_as_nomad_does() {
        let a = device_attribute("11 GiB");
        assert_eq!(a.value, Some(ns::attribute::Value::IntVal(11)));
        assert_eq!(a.unit, "GiB");
        let a = device_attribute("1.5 GHz");
        assert_eq!(a.value, Some(ns::attribute::Value::FloatVal(1.5)));
        let a = device_attribute("true");
        assert_eq!(a.value, Some(ns::attribute::Value::BoolVal(true)));
        let a = device_attribute("GTX 1080 Ti");
        assert_eq!(
            a.value,
            Some(ns::attribute::Value::StringVal("GTX 1080 Ti".into()))
        );
        assert_eq!(a.unit, "");
    }

    #[test]
    fn groups_and_reservations_keep_every_field() {
        let g = nomad_group(
            DeviceGroup::new("v", "t", "n")
                .with_instances([DeviceInstance::unhealthy("i0", "hot")])
                .with_attribute("k", "3"),
        );
        assert_eq!(
            (
                g.vendor.as_str(),
                g.device_type.as_str(),
                g.device_name.as_str()
            ),
            ("v", "t", "n")
        );
        assert_eq!(g.devices[0].id, "i0");
        assert!(!g.devices[0].healthy);
        assert_eq!(g.devices[0].health_description, "hot");
        let r = nomad_reservation(
            Reservation::default()
                .with_env("A", "1")
                .with_device(DeviceNode::new("/h", "/dev/t", "rw")),
        );
        assert_eq!(r.envs["A"], "1");
        assert_eq!(r.devices[0].host_path, "/h");
        assert_eq!(r.devices[0].task_path, "/dev/t");
        assert_eq!(r.devices[0].permissions, "rw");
    }
}
