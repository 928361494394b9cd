//! Getting a guest image into memory and the vCPU into its entry state.

pub mod layout;
pub mod loader;
pub mod regs;

pub use loader::{load_image, EntryPoint, LoadError};
