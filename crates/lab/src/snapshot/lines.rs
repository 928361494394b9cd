//! A VMM's stdout as the guest's lines. Firecracker writes its log messages to stdout
//! through the same line buffer as the guest's serial output, so a message logged while
//! the guest is half-way through a line (the API's record of the `SendCtrlAltDel` it just
//! answered, say) lands inside that line: "wait: ctrl-a<message>\n", then "lt-del 1\n".
//! Waiting for the guest's answer would then wait forever (`bench fork` lost one of 50
//! clones that way). Its messages start with a timestamp ("2026-11-29T08:40:00.123456789
//! [anonymous-instance:fc_api] ..."): cut out, the guest's bytes join up again.

/// The guest's part of a VMM's stdout, line by line.
#[derive(Default)]
pub(crate) struct GuestLines {
    /// The start of a guest line that a log message interrupted.
    pending: String,
}

impl GuestLines {
    /// Takes one line of the VMM's stdout; returns the guest's line it completes, if any.
    pub(crate) fn push(&mut self, line: &str) -> Option<String> {
        match log_message_at(line) {
            Some(at) => {
                self.pending.push_str(&line[..at]);
                None
            }
            None => {
                let mut whole = std::mem::take(&mut self.pending);
                whole.push_str(line);
                Some(whole)
            }
        }
    }
}

/// Where a log message starts in `line`: a timestamp `YYYY-MM-DDTHH:MM:SS` and a `[`
/// after it (the instance and thread).
fn log_message_at(line: &str) -> Option<usize> {
    const SHAPE: &[u8] = b"dddd-dd-ddTdd:dd:dd";
    let bytes = line.as_bytes();
    (0..bytes.len().saturating_sub(SHAPE.len() - 1)).find(|&i| {
        let stamp = SHAPE.iter().zip(&bytes[i..]).all(|(&s, &c)| if s == b'd' { c.is_ascii_digit() } else { c == s });
        stamp && bytes[i + SHAPE.len()..].contains(&b'[')
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_message_inside_a_guest_line_is_cut_out() {
        let mut lines = GuestLines::default();
        let log = "2026-11-29T08:40:00.123456789 [anonymous-instance:fc_api] The API server received a Put request";
        assert_eq!(lines.push("wait: running"), Some("wait: running".into()));
        assert_eq!(lines.push(log), None, "a log line alone is not the guest's");
        assert_eq!(lines.push(&format!("wait: ctrl-a{log}")), None);
        assert_eq!(lines.push("lt-del 1"), Some("wait: ctrl-alt-del 1".into()));
        assert_eq!(lines.push("at 2026-11-29T08:40:00 no bracket"), Some("at 2026-11-29T08:40:00 no bracket".into()));
    }
}
