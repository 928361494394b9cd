//! The `exitless` command's parts, as a library so that the fuzz targets and tests reach
//! the same code the binary runs (the API's request handling above all).

pub mod api;
pub mod args;
pub mod cpu_template;
pub mod report;
pub mod run;
pub mod terminal;
pub mod top;

use std::io::Write;

/// An error and the causes under it, on one line (a cause already quoted is not repeated).
pub fn with_causes(e: &dyn std::error::Error) -> String {
    let mut line = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !line.contains(&text) {
            line = format!("{line}: {text}");
        }
        cause = c.source();
    }
    line
}

/// Logs a panic through the VMM's logger (the API's log file too) before the default hook
/// prints it; the release build then aborts (docs/architecture.md, "Panics").
pub fn log_panics() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let thread = std::thread::current();
        tracing::error!("panic in thread {}: {info}; exitless stops", thread.name().unwrap_or("unnamed"));
        default(info);
    }));
}

/// Warnings and errors to stderr, plainly (`run` and the labs; the API server logs the
/// Firecracker way instead). `EXITLESS_LOG` takes `target=level` directives.
pub fn init_stderr_logging() {
    use tracing_subscriber::prelude::*;
    let filter = api::logging::filter_from_env()
        .unwrap_or_else(|| api::logging::parse_filter("warn,virtio_queue=off").unwrap_or_default());
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .without_time();
    tracing_subscriber::registry().with(filter).with(api::log_rate::PerCallsite::default()).with(fmt).init();
}

/// Serial output straight to stdout, flushed byte by byte so the console is live.
pub struct LiveStdout;

impl Write for LiveStdout {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut out = std::io::stdout().lock();
        out.write_all(buf)?;
        out.flush()?;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stdout().flush()
    }
}
