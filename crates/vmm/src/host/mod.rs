//! What this host's KVM needs from the VMM beyond the KVM API.

pub mod emulate;
