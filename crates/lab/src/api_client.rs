//! The API client the labs drive exitless (and Firecracker) with, and a console reader.

pub use exitless_api_client::{expect_ok, expect_ok_within, listening, request, request_within, Reply};

/// Reads the guest's console until a line containing `needle`, and returns that line.
pub fn wait_for_line(console: &mut impl std::io::BufRead, needle: &str) -> Result<String, String> {
    let mut line = String::new();
    loop {
        line.clear();
        match console.read_line(&mut line) {
            Ok(0) | Err(_) => return Err("its console closed before the guest said it runs".into()),
            Ok(_) if line.contains(needle) => return Ok(line),
            Ok(_) => {}
        }
    }
}
