//! Attaching a virtio-net device on its tap (with MMDS if asked), and what the API, the
//! labs and the report reach it by: its statistics and rate limits, by the id its
//! configuration gave it.

use super::{NetStats, TxMode, VirtioNet};
use crate::device_manager::{Attach, DeviceError, DeviceKind, DeviceManager, DeviceName};
use crate::net::mmds::SharedMmds;
use crate::net::Tap;
use crate::poll::PollMode;
use crate::rate_limiter::{LimiterSlot, Limits};
use std::net::Ipv4Addr;
use std::sync::Arc;

pub const KIND: DeviceKind = DeviceKind("virtio-net");

/// `--net tap=NAME[,mac=..]` and `--net-tx`.
#[derive(Clone, Debug)]
pub struct NetConfig {
    pub tap: String,
    pub mac: [u8; 6],
    pub tx: TxMode,
    /// An MTU advised to the guest (VIRTIO_NET_F_MTU), if any.
    pub mtu: Option<u16>,
    /// Rate limits on received and sent frames.
    pub rx_limits: Limits,
    pub tx_limits: Limits,
    /// MMDS answered on this NIC: the store and its address.
    pub mmds: Option<(SharedMmds, Ipv4Addr)>,
    /// Checksum and segmentation offloads offered (as far as the tap carries them).
    pub offloads: bool,
    /// The id its configuration knows it by (Firecracker's `iface_id`), by which it is
    /// found again (PATCH /network-interfaces/{id}); the device manager's name when not given.
    pub config_id: Option<String>,
}

impl NetConfig {
    /// A NIC on `tap` with `mac`: zero-copy TX, offloads offered, no MTU advice, no
    /// limits, no MMDS (the struct update syntax changes what a caller needs).
    pub fn on_tap(tap: impl Into<String>, mac: [u8; 6]) -> NetConfig {
        NetConfig {
            tap: tap.into(),
            mac,
            tx: TxMode::Zerocopy,
            mtu: None,
            rx_limits: Limits::default(),
            tx_limits: Limits::default(),
            mmds: None,
            offloads: true,
            config_id: None,
        }
    }
}

/// A virtio-net device, for the API, the lab and the report.
pub struct NetHandle {
    /// The id it is found by (NetConfig::config_id, else its device name).
    pub id: String,
    pub stats: Arc<NetStats>,
    pub tap_name: String,
    /// The RX and TX rate limits, changed by [`DeviceManager::set_net_limits`].
    pub limits: [Arc<LimiterSlot>; 2],
}

/// A NIC on `config`, attached as the machine is built, its device thread polling as
/// `poll` says.
pub fn attach(config: NetConfig, poll: PollMode) -> Attach {
    Box::new(move |dm| dm.attach_net(&config, poll))
}

impl DeviceManager {
    /// A virtio-net device on tap `net.tap`.
    pub fn attach_net(&mut self, net: &NetConfig, poll: PollMode) -> Result<(), DeviceError> {
        let tap = Tap::open(&net.tap).map_err(DeviceError::backend)?;
        let tap_name = tap.name().to_string();
        let setup = |source| DeviceError::Setup { name: "virtio-net".into(), source };
        let device = VirtioNet::new(tap, net.mac, net.tx, poll).map_err(setup)?;
        let mut device = device.with_mtu(net.mtu).with_limits(net.rx_limits, net.tx_limits);
        if !net.offloads {
            device = device.without_offloads();
        }
        if let Some((store, ip)) = &net.mmds {
            device = device.with_mmds(store.clone(), *ip);
        }
        let (stats, limits) = (device.stats.clone(), device.limiter_slots());
        let label = match self.nets().count() {
            0 => "virtio-net".to_string(),
            n => format!("virtio-net{n}"),
        };
        let name = DeviceName::keyed(KIND, net.config_id.as_deref(), label);
        let id = net.config_id.clone().unwrap_or_else(|| name.label.clone());
        let handle = NetHandle { id, stats, tap_name, limits };
        self.attach_virtio(name, KIND, Box::new(device), handle).map(drop)
    }

    /// The virtio-net devices, in the order attached.
    pub fn nets(&self) -> impl Iterator<Item = &NetHandle> {
        self.all::<NetHandle>()
    }

    /// The NIC its configuration calls `id`.
    pub fn nic(&self, id: &str) -> Result<&NetHandle, DeviceError> {
        let missing = || DeviceError::NoSuch { what: "network interface", id: id.into() };
        self.nets().find(|n| n.id == id).ok_or_else(missing)
    }

    /// New rate limits for NIC `id`, each way that is given (PATCH /network-interfaces).
    pub fn set_net_limits(&self, id: &str, rx: Option<Limits>, tx: Option<Limits>) -> Result<(), DeviceError> {
        let nic = self.nic(id)?;
        for (slot, limits) in nic.limits.iter().zip([rx, tx]) {
            if let Some(limits) = limits {
                slot.set(limits);
            }
        }
        Ok(())
    }
}
