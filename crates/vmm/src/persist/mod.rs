//! The one contract every stateful part of a machine keeps with a snapshot: its state out,
//! as plain serialisable data, and back in, on a part built from the same configuration.
//! The vCPUs, the VM's in-kernel devices, each device, each virtio transport and the device
//! manager (its devices as a tree keyed by name, with their placements) implement it; the
//! state file (crate::snapshot) holds what they save. Modelled on Firecracker's `Persist`.
//!
//! Devices with work in flight are [`Pausable`]: the machine pauses them before any state
//! is read and resumes them after, so no save pauses anything behind the caller's back.

pub mod vcpu;

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Why a state could not be read or put back: one line, naming the part and what.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct PersistError(pub String);

impl From<(&'static str, kvm_ioctls::Error)> for PersistError {
    fn from((what, e): (&'static str, kvm_ioctls::Error)) -> Self {
        PersistError(format!("{what} failed: {e}"))
    }
}

impl From<String> for PersistError {
    fn from(why: String) -> Self {
        PersistError(why)
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
}

/// A part whose work runs on threads of its own: paused, nothing is in flight.
pub trait Pausable {
    fn pause(&self) -> Result<(), PersistError>;
    fn resume(&self) -> Result<(), PersistError>;
}
