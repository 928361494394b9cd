//! Locks without poison handling at every call. A release build aborts on a panic
//! (docs/architecture.md, "Panics"), so no lock is ever seen poisoned there; test builds
//! unwind, and there a poisoned lock is taken back so one failing thread does not fail
//! every other.

use std::sync::{Mutex, MutexGuard};

/// Locks `mutex`, recovering the guard if a holder panicked.
#[inline]
pub fn lock<T: ?Sized>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}
