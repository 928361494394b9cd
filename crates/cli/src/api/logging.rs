//! Where the VMM's log goes, at what level and in which shape: stderr at `warn` until
//! `--log-path` / `--level` or `PUT /logger` say otherwise (Firecracker's levels: Error,
//! Warning, Info, Debug, Trace, Off). Lines look like Firecracker's:
//! `TIMESTAMP [ID:THREAD(:LEVEL)(:FILE:LINE)] MESSAGE`, with the level and origin shown as
//! `show_level` / `show_log_origin` ask, and only modules under `module` if one is given.
//!
//! The file is opened as Firecracker opens it (sink::open): a FIFO nobody reads yet never
//! blocks the VMM, and a line that does not fit in a full FIFO is dropped and counted
//! (`logger.missed_log_count` in the metrics).

use super::model::Logger;
use super::sink;
use std::fmt::Write as _;
use std::fs::File;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, RwLock};
use tracing::{Event, Subscriber};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::{reload, Registry};

static FILE: Mutex<Option<File>> = Mutex::new(None);
static FILTER: OnceLock<reload::Handle<Targets, Registry>> = OnceLock::new();
static FORMAT: RwLock<Format> = RwLock::new(Format { show_level: false, show_origin: false, module: None });
static INSTANCE_ID: OnceLock<String> = OnceLock::new();
/// Lines dropped because the log file (a full FIFO) would not take them.
pub static MISSED_LINES: AtomicU64 = AtomicU64::new(0);

/// Firecracker's log line options.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Format {
    pub show_level: bool,
    pub show_origin: bool,
    /// Only events from modules whose path starts with this.
    pub module: Option<String>,
}

/// The log's destination: the file once one is set, stderr before.
pub struct Sink;

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let mut file = exitless_vmm::sync::lock(&FILE);
        let written = match file.as_mut() {
            Some(f) => sink::write_line(f, buf),
            None => std::io::stderr().write_all(buf).is_ok(),
        };
        if !written {
            MISSED_LINES.fetch_add(1, Ordering::Relaxed);
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Firecracker's line shape.
struct FirecrackerLine;

impl<S, N> FormatEvent<S, N> for FirecrackerLine
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(&self, ctx: &FmtContext<'_, S, N>, mut writer: Writer<'_>, event: &Event<'_>) -> std::fmt::Result {
        let meta = event.metadata();
        let format = FORMAT.read().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(module) = &format.module {
            if !meta.module_path().is_some_and(|p| p.starts_with(module.as_str())) {
                return Ok(());
            }
        }
        let thread = std::thread::current();
        let id = INSTANCE_ID.get().map(String::as_str).unwrap_or("anonymous-instance");
        let mut tag = format!("{id}:{}", thread.name().unwrap_or("-"));
        if format.show_level {
            write!(tag, ":{}", meta.level())?;
        }
        if format.show_origin {
            write!(tag, ":{}:{}", meta.file().unwrap_or("?"), meta.line().map_or("?".into(), |l| l.to_string()))?;
        }
        write!(writer, "{} [{tag}] ", timestamp(std::time::SystemTime::now()))?;
        ctx.field_format().format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}

/// `2026-11-24T03:15:26.123456789`, UTC.
fn timestamp(t: std::time::SystemTime) -> String {
    let since = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, rest) = ((secs / 86_400) as i64, secs % 86_400);
    // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:09}",
        rest / 3600,
        rest / 60 % 60,
        rest % 60,
        since.subsec_nanos()
    )
}

/// Installs the process's subscriber with a level that can change later; `id` is the
/// microVM's, shown in every line.
pub fn init(default: &str, id: &str) {
    use tracing_subscriber::prelude::*;
    let _ = INSTANCE_ID.set(id.to_string());
    let filter = filter_from_env().unwrap_or_else(|| parse_filter(default).unwrap_or_default());
    let (filter, handle) = reload::Layer::new(filter);
    let fmt = tracing_subscriber::fmt::layer().with_writer(|| Sink).with_ansi(false).event_format(FirecrackerLine);
    let limits = super::log_rate::PerCallsite::default();
    if tracing_subscriber::registry().with(filter).with(limits).with(fmt).try_init().is_ok() {
        let _ = FILTER.set(handle);
    }
}

/// `EXITLESS_LOG`'s directives (`target=level,...`), when set and well formed. Targets,
/// not EnvFilter: the same syntax without span or field matching, and without the regex
/// engine that made a tenth of the binary.
pub fn filter_from_env() -> Option<Targets> {
    parse_filter(&std::env::var("EXITLESS_LOG").ok()?).ok()
}

pub fn parse_filter(directives: &str) -> Result<Targets, String> {
    directives.parse().map_err(|e| format!("'{directives}' is not a log filter: {e}"))
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

/// Sets the line shape (`--show-level`, `--show-log-origin`, `--module`, `PUT /logger`).
pub fn set_format(format: Format) {
    *FORMAT.write().unwrap_or_else(|e| e.into_inner()) = format;
}

/// Sends the log to `path` (a file or FIFO, never blocking) at `level`.
pub fn to_file(path: &str, level: Option<&str>) -> Result<(), String> {
    let filter = level.map(filter_for).transpose()?;
    let file = sink::open(path).map_err(|e| format!("Cannot open the log file {path}: {e}"))?;
    *exitless_vmm::sync::lock(&FILE) = Some(file);
    set_level(filter)
}

fn set_level(filter: Option<&str>) -> Result<(), String> {
    if let (Some(filter), Some(handle)) = (filter, FILTER.get()) {
        handle.reload(parse_filter(filter)?).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// `PUT /logger`: Firecracker's fields, every one optional but for where the log goes.
pub fn set(l: &Logger) -> Result<(), String> {
    let filter = l.level.as_deref().map(filter_for).transpose()?;
    let old = FORMAT.read().unwrap_or_else(|e| e.into_inner()).clone();
    match &l.log_path {
        Some(path) => to_file(path, l.level.as_deref())?,
        None => set_level(filter)?,
    }
    set_format(Format {
        show_level: l.show_level.unwrap_or(old.show_level),
        show_origin: l.show_log_origin.unwrap_or(old.show_origin),
        module: l.module.clone().or(old.module),
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_utc_civil_dates() {
        let t = std::time::UNIX_EPOCH + std::time::Duration::new(1_795_490_126, 5);
        assert_eq!(timestamp(t), "2026-11-24T03:15:26.000000005");
        assert_eq!(timestamp(std::time::UNIX_EPOCH), "1970-01-01T00:00:00.000000000");
        let leap = std::time::UNIX_EPOCH + std::time::Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(&timestamp(leap)[..10], "2000-02-29");
    }
}
