//! The device options of `exitless run`: `--net`, `--drive`, `--vsock`, `--mmds-version`,
//! `--net-tx`, and MAC addresses (the API's `guest_mac` too).

use super::{parse_on_off, parse_size};
use std::path::PathBuf;

/// `tap=NAME[,mac=MAC][,offloads=off]`: the tap, the guest's MAC, whether checksum and
/// segmentation offloads are offered.
pub fn parse_net(s: &str) -> Result<(String, Option<[u8; 6]>, bool), String> {
    let (mut tap, mut mac, mut offloads) = (None, None, true);
    for part in s.split(',') {
        match part.split_once('=') {
            Some(("tap", name)) if !name.is_empty() && name.len() < 16 => tap = Some(name.to_string()),
            Some(("mac", m)) => mac = Some(parse_mac(m)?),
            Some(("offloads", "on")) => offloads = true,
            Some(("offloads", "off")) => offloads = false,
            _ => {
                return Err(format!(
                    "'{part}' is not tap=NAME (up to 15 bytes), mac=xx:xx:xx:xx:xx:xx or offloads=on|off"
                ))
            }
        }
    }
    Ok((tap.ok_or("--net needs tap=NAME")?, mac, offloads))
}

pub fn parse_mmds_version(s: &str) -> Result<exitless_vmm::net::mmds::Version, String> {
    match s {
        "V1" | "v1" | "1" => Ok(exitless_vmm::net::mmds::Version::V1),
        "V2" | "v2" | "2" => Ok(exitless_vmm::net::mmds::Version::V2),
        _ => Err(format!("{s:?} is not an MMDS version: V1 or V2")),
    }
}

pub fn parse_vsock(s: &str) -> Result<exitless_vmm::virtio::vsock::VsockConfig, String> {
    let (mut cid, mut uds) = (None, None);
    for part in s.split(',') {
        match part.split_once('=') {
            Some(("cid", n)) => cid = Some(n.parse::<u64>().map_err(|_| format!("cid '{n}' is not a number"))?),
            Some(("uds", p)) if !p.is_empty() => uds = Some(PathBuf::from(p)),
            _ => return Err(format!("'{part}' is not cid=N or uds=PATH")),
        }
    }
    let guest_cid = cid.ok_or("--vsock needs cid=N")?;
    Ok(exitless_vmm::virtio::vsock::VsockConfig { guest_cid, uds_path: uds.ok_or("--vsock needs uds=PATH")?, id: None })
}

pub fn parse_drive(s: &str) -> Result<exitless_vmm::virtio::blk::DriveConfig, String> {
    use exitless_vmm::virtio::blk::request::ID_LEN;
    let mut drive = exitless_vmm::virtio::blk::DriveConfig::new("");
    let (mut path, mut iops, mut bandwidth) = (None, 0, 0);
    for part in s.split(',') {
        match part.split_once('=') {
            Some(("iops", n)) => iops = n.parse().map_err(|_| format!("iops '{n}' is not a whole number"))?,
            Some(("bw", n)) => bandwidth = parse_size(n)?,
            Some(("path", p)) if !p.is_empty() => path = Some(PathBuf::from(p)),
            Some(("readonly", v)) => drive.readonly = parse_on_off(v)?,
            Some(("direct", v)) => drive.direct = parse_on_off(v)?,
            Some(("engine", "io_uring")) => drive.thread_pool = false,
            Some(("engine", "pool")) => drive.thread_pool = true,
            Some(("id", id)) if id.len() <= ID_LEN => drive.id = Some(id.to_string()),
            Some(("id", id)) => {
                return Err(format!("id '{id}' is longer than {ID_LEN} bytes (what GET_ID can return)"))
            }
            _ => {
                return Err(format!(
                    "'{part}' is not path=FILE, readonly=on|off, id=NAME, direct=on|off, engine=io_uring|pool, \
                     iops=N or bw=SIZE"
                ))
            }
        }
    }
    drive.path = path.ok_or("--drive needs path=FILE")?;
    // Buckets of 100 ms, as a user's limit per second would be read.
    drive.limits =
        exitless_vmm::rate_limiter::Limits::per_second(iops, bandwidth, std::time::Duration::from_millis(100));
    Ok(drive)
}

pub fn parse_mac(s: &str) -> Result<[u8; 6], String> {
    let bytes: Vec<u8> = s
        .split(':')
        .map(|b| u8::from_str_radix(b, 16))
        .collect::<Result<_, _>>()
        .map_err(|_| format!("'{s}' is not a MAC"))?;
    bytes.try_into().map_err(|_| format!("'{s}' is not a MAC"))
}

pub(super) fn parse_tx(s: &str) -> Result<exitless_vmm::virtio::net::TxMode, String> {
    match s {
        "copy" => Ok(exitless_vmm::virtio::net::TxMode::Copy),
        "zerocopy" => Ok(exitless_vmm::virtio::net::TxMode::Zerocopy),
        _ => Err(format!("'{s}' is not copy or zerocopy")),
    }
}
