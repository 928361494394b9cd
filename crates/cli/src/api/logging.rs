//! Where the VMM's log goes and at what level: stderr at `warn` until `--log-path` /
//! `--level` or `PUT /logger` say otherwise (Firecracker's levels: Error, Warning, Info,
//! Debug, Trace, Off).

use super::model::Logger;
use std::fs::File;
use std::io::Write;
use std::sync::{Mutex, OnceLock};
use tracing_subscriber::{reload, EnvFilter, Registry};

static FILE: Mutex<Option<File>> = Mutex::new(None);
static FILTER: OnceLock<reload::Handle<EnvFilter, Registry>> = OnceLock::new();

/// The log's destination: the file once one is set, stderr before.
pub struct Sink;

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match FILE.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
            Some(f) => f.write(buf),
            None => std::io::stderr().write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Installs the process's subscriber with a level that can change later.
pub fn init(default: &str) {
    use tracing_subscriber::prelude::*;
    let filter = EnvFilter::try_from_env("EXITLESS_LOG").unwrap_or_else(|_| default.into());
    let (filter, handle) = reload::Layer::new(filter);
    let fmt = tracing_subscriber::fmt::layer().with_writer(|| Sink).with_target(false).with_ansi(false);
    if tracing_subscriber::registry().with(filter).with(fmt).try_init().is_ok() {
        let _ = FILTER.set(handle);
    }
}

/// Firecracker's level names, as a tracing filter.
pub fn filter_for(level: &str) -> Result<&'static str, String> {
    Ok(match level.to_ascii_lowercase().as_str() {
        "error" => "error",
        "warning" | "warn" => "warn,virtio_queue=off",
        "info" => "info,virtio_queue=off",
        "debug" => "debug,virtio_queue=off",
        "trace" => "trace",
        "off" => "off",
        _ => return Err(format!("'{level}' is not a log level (Error, Warning, Info, Debug, Trace or Off)")),
    })
}

/// Sends the log to `path` (appending; a FIFO works) at `level`.
pub fn to_file(path: &str, level: Option<&str>) -> Result<(), String> {
    let filter = level.map(filter_for).transpose()?;
    let file = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .map_err(|e| format!("Cannot open the log file {path}: {e}"))?;
    *FILE.lock().unwrap_or_else(|e| e.into_inner()) = Some(file);
    if let (Some(filter), Some(handle)) = (filter, FILTER.get()) {
        handle.reload(EnvFilter::new(filter)).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// `PUT /logger`.
pub fn set(l: &Logger) -> Result<(), String> {
    if l.module.is_some() || l.show_log_origin == Some(true) {
        return Err("module and show_log_origin are not supported by exitless's logger.".into());
    }
    to_file(&l.log_path, l.level.as_deref())
}
