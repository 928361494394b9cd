//! The `exitless` command's parts, as a library so that the fuzz targets and tests reach
//! the same code the binary runs (the API's request handling above all).

pub mod api;
pub mod args;
pub mod report;
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
