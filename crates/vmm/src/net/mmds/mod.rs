//! MMDS, the microVM metadata service: a JSON document the host sets through the API
//! (`PUT`/`PATCH /mmds`) and the guest reads over HTTP at a link-local address. The VMM
//! answers it on the NICs named in `/mmds/config`, before frames reach the tap
//! (stack.rs), so nothing about it leaves the host.

mod http;
mod stack;
mod store;
mod token;

pub use stack::{wants, MmdsCounters, MmdsStack};
pub use store::{Format, Mmds, MmdsError, Version};

use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};

/// The one store the API writes and every MMDS-enabled NIC reads.
pub type SharedMmds = Arc<Mutex<Mmds>>;

/// Where the guest finds MMDS unless configured otherwise.
pub const DEFAULT_ADDRESS: Ipv4Addr = Ipv4Addr::new(169, 254, 169, 254);
/// Firecracker's default limit on the document's size, in bytes.
pub const DEFAULT_SIZE_LIMIT: usize = 51200;

#[cfg(test)]
mod tests;
