//! The jailer's one kind of failure: a line naming the flag at fault (if one is) and why.

/// Why the jail could not be made.
#[derive(Debug, thiserror::Error)]
pub enum JailError {
    /// A flag's value is wrong.
    #[error("{flag}: {message}")]
    Flag { flag: &'static str, message: String },
    /// A step of making the jail failed.
    #[error("{0}")]
    Step(String),
}

impl JailError {
    pub fn flag(flag: &'static str, message: String) -> JailError {
        JailError::Flag { flag, message }
    }

    /// `what` failed with the OS error now in errno.
    pub fn os(what: impl std::fmt::Display) -> JailError {
        JailError::Step(format!("{what}: {}", std::io::Error::last_os_error()))
    }

    pub fn io(what: impl std::fmt::Display, e: std::io::Error) -> JailError {
        JailError::Step(format!("{what}: {e}"))
    }
}
