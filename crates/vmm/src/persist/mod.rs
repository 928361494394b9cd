//! The one contract every stateful part of a machine keeps with a snapshot: its state out,
//! as plain serialisable data, and back in, on a part built from the same configuration.
//! The vCPUs, the VM's in-kernel devices, each device, each virtio transport and the device
//! manager (its devices as a tree keyed by the ids the API gave, with their placements)
//! implement it; the state file (crate::snapshot) holds what they save. Modelled on
//! Firecracker's `Persist`. A device's own state is typed and versioned (state.rs): the
//! device manager keeps it as a [`Saved`] and every device reads it back through
//! [`Saved::decode`].
//!
//! Devices with work in flight are [`Pausable`]: the machine pauses them before any state
//! is read and resumes them after, so no save pauses anything behind the caller's back.

pub mod state;
pub mod vcpu;

pub use state::{DeviceState, Saved, StateError, StateFault};

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Why a state could not be read or put back: one line, naming the part and what.
#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    /// A device's own state, refused or not written.
    #[error(transparent)]
    State(#[from] StateError),
    #[error("{what} failed: {source}")]
    Kvm {
        what: &'static str,
        #[source]
        source: kvm_ioctls::Error,
    },
    /// A device's state that does not fit it, before it is known whose: the device
    /// manager names it ([`PersistError::named`]).
    #[error(transparent)]
    Fault(#[from] StateFault),
    /// What the part refused, said by it.
    #[error("{0}")]
    Refused(String),
}

impl PersistError {
    /// This error, said of device `device`.
    pub fn named(self, device: &str) -> PersistError {
        match self {
            PersistError::Fault(fault) => PersistError::State(fault.of(device)),
            PersistError::Refused(why) => PersistError::Refused(format!("{device}: {why}")),
            named => named,
        }
    }
}

impl From<(&'static str, kvm_ioctls::Error)> for PersistError {
    fn from((what, source): (&'static str, kvm_ioctls::Error)) -> Self {
        PersistError::Kvm { what, source }
    }
}

impl From<String> for PersistError {
    fn from(why: String) -> Self {
        PersistError::Refused(why)
    }
}

pub trait Persist<'a> {
    /// What is saved.
    type State: Serialize + DeserializeOwned;
    /// What reading the state needs besides the part (a vCPU's id and MSR list); `()` for
    /// most.
    type SaveArgs;
    /// What putting it back needs besides the state (the VM's clock policy); `()` for most.
    type RestoreArgs;

    fn save(&self, args: Self::SaveArgs) -> Result<Self::State, PersistError>;

    /// Puts `state` back; a state that contradicts this part is refused whole, with one
    /// line, before anything of it is applied where the part can check it first.
    fn restore(&self, args: Self::RestoreArgs, state: &Self::State) -> Result<(), PersistError>;

    /// What a restored part does once the vCPUs hold their state again and before they run
    /// (an interrupt raised earlier would be lost under their restored local APICs):
    /// nothing, for most.
    fn start_restored(&self) -> Result<(), PersistError> {
        Ok(())
    }
}

/// A device's part of a snapshot as the device manager sees it, whatever the device: its
/// state out as a [`Saved`], and back in through [`Saved::decode`], both named `device`
/// (the device's key in the snapshot) in what they refuse. Every [`Persist`] part with a
/// [`DeviceState`] and no arguments is one.
pub trait DeviceSnapshot: Send + Sync {
    fn save_state(&self, device: &str) -> Result<Saved, PersistError>;
    fn restore_state(&self, device: &str, saved: &Saved) -> Result<(), PersistError>;
    /// [`Persist::start_restored`].
    fn start_restored(&self, device: &str) -> Result<(), PersistError>;
}

impl<T> DeviceSnapshot for T
where
    T: Persist<'static, SaveArgs = (), RestoreArgs = ()> + Send + Sync,
    <T as Persist<'static>>::State: DeviceState,
{
    fn save_state(&self, device: &str) -> Result<Saved, PersistError> {
        let state = self.save(()).map_err(|e| e.named(device))?;
        Ok(Saved::encode(&state).map_err(|fault| fault.of(device))?)
    }

    fn restore_state(&self, device: &str, saved: &Saved) -> Result<(), PersistError> {
        let state = saved.decode().map_err(|fault| fault.of(device))?;
        self.restore((), &state).map_err(|e| e.named(device))
    }

    fn start_restored(&self, device: &str) -> Result<(), PersistError> {
        Persist::start_restored(self).map_err(|e| e.named(device))
    }
}

/// A part whose work runs on threads of its own: paused, nothing is in flight.
pub trait Pausable {
    fn pause(&self) -> Result<(), PersistError>;
    fn resume(&self) -> Result<(), PersistError>;
}
