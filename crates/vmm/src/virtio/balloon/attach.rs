//! The balloon device: attached like every virtio device, then reached by the API for
//! its target, statistics interval and free page hinting runs.

use super::{BalloonConfig, BalloonShared, VirtioBalloon, HINT_CMD_DONE};
use crate::device_manager::{Attach, DeviceError, DeviceKind, DeviceManager, VirtioTransport};
use std::sync::atomic::Ordering;
use std::sync::Arc;

pub const KIND: DeviceKind = DeviceKind("virtio-balloon");

/// A balloon on `config`, attached as the machine is built.
pub fn attach(config: BalloonConfig) -> Attach {
    Box::new(move |dm| dm.attach_balloon(config))
}

/// The virtio-balloon device, for the API and the report.
pub struct BalloonHandle {
    pub config: BalloonConfig,
    pub shared: Arc<BalloonShared>,
}

/// Why a balloon request was refused, in Firecracker v1.16.1's words (`VmmError`,
/// `BalloonError`), which the API wraps as Firecracker does.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum BalloonError {
    #[error("Failed perform action on device: Device not found")]
    NoBalloon,
    #[error("Balloon: Statistics cannot be enabled/disabled after activation.")]
    StatisticsChange,
    #[error("Balloon: Attempting to use hinting when not enabled")]
    HintingOff,
    #[error("Balloon: Device not activated yet.")]
    NotActive,
}

impl DeviceManager {
    /// A virtio-balloon device (Firecracker's `PUT /balloon`).
    pub fn attach_balloon(&mut self, config: BalloonConfig) -> Result<(), DeviceError> {
        let setup = |source| DeviceError::Setup { name: "virtio-balloon".into(), source };
        let device = VirtioBalloon::new(config, self.memory()).map_err(setup)?;
        let handle = BalloonHandle { config, shared: device.shared.clone() };
        self.attach_virtio("virtio-balloon", KIND, Box::new(device), handle).map(drop)
    }

    /// The balloon and its transport.
    pub fn balloon(&self) -> Result<(&BalloonHandle, &VirtioTransport), BalloonError> {
        self.virtio_of::<BalloonHandle>().next().ok_or(BalloonError::NoBalloon)
    }

    /// A new target of `pages` 4 KiB pages, the driver told by a configuration change.
    pub fn set_balloon_target(&self, pages: u32) -> Result<(), BalloonError> {
        let (balloon, transport) = self.balloon()?;
        balloon.shared.target_pages.store(pages, Ordering::Release);
        transport.core().config_changed();
        Ok(())
    }

    /// A new statistics interval; a balloon without statistics cannot gain them, nor one
    /// with them lose them (Firecracker's rules: the queue exists or not from the start).
    pub fn set_balloon_stats_interval(&self, seconds: u16) -> Result<(), BalloonError> {
        let (balloon, _) = self.balloon()?;
        match (balloon.config.stats_polling_interval_s, seconds) {
            (0, 0) => Ok(()),
            (0, _) | (_, 0) => Err(BalloonError::StatisticsChange),
            _ => {
                balloon.shared.stats_interval_s.store(u32::from(seconds), Ordering::Release);
                Ok(())
            }
        }
    }

    /// Starts a free page hinting run (a new command id; `acknowledge_on_stop`: the
    /// device answers the driver's end of the run with DONE itself).
    pub fn start_balloon_hinting(&self, acknowledge_on_stop: bool) -> Result<u32, BalloonError> {
        let (balloon, transport) = self.hinting_balloon()?;
        let cmd = {
            let mut hint = crate::sync::lock(&balloon.shared.hint);
            let cmd = hint.last_cmd.wrapping_add(1).max(HINT_CMD_DONE + 1);
            (hint.last_cmd, hint.host_cmd, hint.acknowledge_on_stop) = (cmd, cmd, acknowledge_on_stop);
            cmd
        };
        transport.core().config_changed();
        Ok(cmd)
    }

    /// Ends the hinting run: the driver may use the hinted pages again.
    pub fn stop_balloon_hinting(&self) -> Result<(), BalloonError> {
        let (balloon, transport) = self.hinting_balloon()?;
        crate::sync::lock(&balloon.shared.hint).host_cmd = HINT_CMD_DONE;
        transport.core().config_changed();
        Ok(())
    }

    /// The balloon, if free page hinting is on and its driver runs.
    pub fn hinting_balloon(&self) -> Result<(&BalloonHandle, &VirtioTransport), BalloonError> {
        let (balloon, transport) = self.balloon()?;
        if !balloon.config.free_page_hinting {
            return Err(BalloonError::HintingOff);
        }
        if transport.core().status() & crate::virtio::STATUS_DRIVER_OK == 0 {
            return Err(BalloonError::NotActive);
        }
        Ok((balloon, transport))
    }
}
