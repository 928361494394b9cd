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

/// Reads `lock`, recovering the guard if a writer panicked.
#[inline]
pub fn read<T: ?Sized>(lock: &std::sync::RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|e| e.into_inner())
}

/// Writes `lock`, recovering the guard if a holder panicked.
#[inline]
pub fn write<T: ?Sized>(lock: &std::sync::RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|e| e.into_inner())
}
