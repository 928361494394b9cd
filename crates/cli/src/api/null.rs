//! `null` read as a field's default: Firecracker writes `"drives": null` and the like.

use serde::Deserialize;

/// `null` as the type's default.
pub fn null_is_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}
