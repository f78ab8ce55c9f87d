//! The layout of a cache device, computed in one place.
//!
//! A cache device holds two superblock copies and two metadata record
//! regions before its lines (docs/format.md), so "a cache of N bytes of
//! lines" and "a device of N bytes" are different sizes. Whoever asks how
//! large a device must be for a cache, how many lines a device holds, or
//! whether a cache fits a device (the binary before it opens or creates a
//! device, recovery when it formats one, a cache array when it sizes its
//! members) asks these functions, so all of them agree with the format.

use iocache_core::units::format_byte_size;
use iocache_format::{FormatError, Layout};

/// Why a cache cannot have the layout asked for.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    /// The format refuses the geometry: a line size out of range, a size
    /// that overflows, or a device too small for even one line.
    #[error(transparent)]
    Format(#[from] FormatError),
    /// The device is smaller than the lines asked for and their metadata.
    #[error(
        "{} of lines and their metadata need {}, more than the device's {}",
        format_byte_size(*.cache_bytes),
        format_byte_size(*.needed_bytes),
        format_byte_size(*.device_bytes)
    )]
    DoesNotFit {
        /// The bytes of lines asked for.
        cache_bytes: u64,
        /// The device size those lines and their metadata need.
        needed_bytes: u64,
        /// The device's size.
        device_bytes: u64,
    },
}

/// The layout of a cache of `slots` lines of `line_bytes`.
pub fn layout_for_slots(line_bytes: u64, slots: u64) -> Result<Layout, LayoutError> {
    Ok(Layout::for_slots(line_bytes, slots)?)
}

/// The layout of a cache of `cache_bytes` of lines: as many whole lines of
/// `line_bytes` as fit in it, and at least one.
pub fn layout_for_bytes(line_bytes: u64, cache_bytes: u64) -> Result<Layout, LayoutError> {
    layout_for_slots(line_bytes, (cache_bytes / line_bytes.max(1)).max(1))
}

/// The size of a device created for `cache_bytes` of lines (see
/// [`layout_for_bytes`]): the lines and their metadata.
pub fn device_bytes_for(line_bytes: u64, cache_bytes: u64) -> Result<u64, LayoutError> {
    Ok(layout_for_bytes(line_bytes, cache_bytes)?.device_bytes())
}

/// The most lines of `line_bytes` a device of `device_bytes` holds, with
/// their metadata.
pub fn slots_fitting(line_bytes: u64, device_bytes: u64) -> Result<u64, LayoutError> {
    Ok(Layout::fitting(line_bytes, device_bytes)?.slots)
}

/// The layout of a cache of `cache_bytes` of lines (see
/// [`layout_for_bytes`]) on a device of `device_bytes`, or
/// [`LayoutError::DoesNotFit`] naming the three sizes when the device is too
/// small for it.
pub fn fit_bytes(line_bytes: u64, cache_bytes: u64, device_bytes: u64) -> Result<Layout, LayoutError> {
    check_fits(
        layout_for_bytes(line_bytes, cache_bytes)?,
        cache_bytes,
        device_bytes,
    )
}

/// The layout of a cache of `slots` lines on a device of `device_bytes`, or
/// [`LayoutError::DoesNotFit`] when the device is too small for it.
pub fn fit_slots(line_bytes: u64, slots: u64, device_bytes: u64) -> Result<Layout, LayoutError> {
    check_fits(
        layout_for_slots(line_bytes, slots)?,
        slots.saturating_mul(line_bytes),
        device_bytes,
    )
}

fn check_fits(layout: Layout, cache_bytes: u64, device_bytes: u64) -> Result<Layout, LayoutError> {
    if layout.device_bytes() > device_bytes {
        return Err(LayoutError::DoesNotFit {
            cache_bytes,
            needed_bytes: layout.device_bytes(),
            device_bytes,
        });
    }
    Ok(layout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_created_for_a_cache_holds_exactly_that_cache() {
        for line_bytes in [512, 4096, 65536, 1 << 20] {
            for cache_bytes in [line_bytes, 16 * line_bytes, 1000 * line_bytes + 7] {
                let device = device_bytes_for(line_bytes, cache_bytes).unwrap();
                assert_eq!(
                    slots_fitting(line_bytes, device).unwrap(),
                    cache_bytes / line_bytes
                );
                let layout = fit_bytes(line_bytes, cache_bytes, device).unwrap();
                assert_eq!(layout.slots, cache_bytes / line_bytes);
                assert_eq!(fit_slots(line_bytes, layout.slots, device), Ok(layout));
                assert_eq!(
                    fit_bytes(line_bytes, cache_bytes, device - 1),
                    Err(LayoutError::DoesNotFit {
                        cache_bytes,
                        needed_bytes: device,
                        device_bytes: device - 1,
                    })
                );
            }
        }
    }

    #[test]
    fn errors_name_the_sizes() {
        let e = fit_bytes(4096, 4 << 20, 1 << 20).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("4MiB") && text.contains("1MiB"), "{text}");
        let e = slots_fitting(4096, 100).unwrap_err();
        assert!(
            matches!(e, LayoutError::Format(FormatError::DeviceTooSmall { .. })),
            "{e}"
        );
        assert!(layout_for_bytes(3000, 1 << 20).is_err());
    }
}
