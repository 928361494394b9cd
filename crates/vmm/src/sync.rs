//! Locks that survive a panicking holder: the state a device keeps behind a mutex stays
//! usable (every writer leaves it consistent between statements), so a panic on one
//! thread must not take the VMM's other threads with it.

use std::sync::{Mutex, MutexGuard};

/// Locks `mutex`, recovering the guard if a holder panicked.
#[inline]
pub fn lock<T: ?Sized>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}
