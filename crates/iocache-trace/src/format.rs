//! The supported trace formats and their names on the command line.
//!
//! A format is named by a short word (`msr`, `blkparse`, ...), optionally with
//! one parameter (`blkparse:action=D`, `lba:block=4096`). `Display` prints the
//! canonical name, which `FromStr` parses back to the same value.

use std::fmt;
use std::str::FromStr;

use crate::error::FormatNameError;

/// A block I/O trace format. See the crate documentation for each format's
/// fields and units.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TraceFormat {
    /// MSR Cambridge CSV (`Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime`).
    Msr,
    /// SNIA SYSTOR'17 CSV (`Timestamp,Response,IOType,LUN,Offset,Size`).
    Systor,
    /// Tencent CBS CSV (`timestamp_s,offset_sectors,size_sectors,io_type,volume_id`).
    Tencent,
    /// FIU SRCMap / IODedup (`ts pid process lba size op major minor md5`).
    Fiu,
    /// CloudPhysics vscsi CSV (`version,time,op,size,lbn`).
    VscsiCsv,
    /// DiskSim ASCII as used by MQSim (`arrival_time device lba size type`).
    Disksim,
    /// ARC / UMass `lis` (`start_sector nsectors ignored request_no`).
    Arc,
    /// blkparse default text output; records come from lines whose action is
    /// `action` (by default `b'Q'`, queued).
    Blkparse {
        /// The blktrace action letter whose lines become records.
        action: u8,
    },
    /// fio iolog, version 2 or 3.
    Fio,
    /// One logical block address per line, each a read of `block_bytes`.
    Lba {
        /// Size of one block in bytes.
        block_bytes: u64,
    },
}

/// The format names accepted by `FromStr`, in the order they are listed in
/// messages.
pub const FORMAT_NAMES: &[&str] = &[
    "msr",
    "systor",
    "tencent",
    "fiu",
    "vscsi-csv",
    "disksim",
    "arc",
    "blkparse",
    "fio",
    "lba",
];

/// The default action for [`TraceFormat::Blkparse`]: `Q` (queued), the first
/// event of every request the block layer sees.
pub const DEFAULT_BLKPARSE_ACTION: u8 = b'Q';

/// The default block size for [`TraceFormat::Lba`].
pub const DEFAULT_LBA_BLOCK_BYTES: u64 = 512;

impl TraceFormat {
    /// The blkparse format with the default action (`Q`).
    pub const BLKPARSE: TraceFormat = TraceFormat::Blkparse {
        action: DEFAULT_BLKPARSE_ACTION,
    };

    /// The lba format with the default block size (512 bytes).
    pub const LBA: TraceFormat = TraceFormat::Lba {
        block_bytes: DEFAULT_LBA_BLOCK_BYTES,
    };

    /// The format's base name, without parameters.
    /// Whether records carry real times; `arc` and `lba` number records instead.
    pub fn has_timestamps(&self) -> bool {
        !matches!(self, TraceFormat::Arc | TraceFormat::Lba { .. })
    }

    pub fn name(&self) -> &'static str {
        match self {
            TraceFormat::Msr => "msr",
            TraceFormat::Systor => "systor",
            TraceFormat::Tencent => "tencent",
            TraceFormat::Fiu => "fiu",
            TraceFormat::VscsiCsv => "vscsi-csv",
            TraceFormat::Disksim => "disksim",
            TraceFormat::Arc => "arc",
            TraceFormat::Blkparse { .. } => "blkparse",
            TraceFormat::Fio => "fio",
            TraceFormat::Lba { .. } => "lba",
        }
    }
}

impl fmt::Display for TraceFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            TraceFormat::Blkparse { action } if action != DEFAULT_BLKPARSE_ACTION => {
                write!(f, "blkparse:action={}", char::from(action))
            }
            TraceFormat::Lba { block_bytes } if block_bytes != DEFAULT_LBA_BLOCK_BYTES => {
                write!(f, "lba:block={block_bytes}")
            }
            _ => f.write_str(self.name()),
        }
    }
}

fn valid_names() -> String {
    "valid formats: msr, systor, tencent, fiu, vscsi-csv, disksim, arc, \
     blkparse (or blkparse:action=X, X a blktrace action letter, default Q), fio, \
     lba (or lba:block=N, N the block size in bytes, default 512)"
        .to_string()
}

impl FromStr for TraceFormat {
    type Err = FormatNameError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let (name, param) = match s.split_once(':') {
            Some((name, param)) => (name, Some(param)),
            None => (s, None),
        };
        let name = name.to_ascii_lowercase();
        let param = param.map(|p| match p.split_once('=') {
            Some((key, value)) => (key.trim().to_ascii_lowercase(), value.trim()),
            None => (p.trim().to_ascii_lowercase(), ""),
        });
        let no_param = |format: TraceFormat| match &param {
            None => Ok(format),
            Some((key, _)) => Err(FormatNameError(format!(
                "format `{name}` takes no parameter (found `{key}`); {}",
                valid_names()
            ))),
        };
        match name.as_str() {
            "msr" => no_param(TraceFormat::Msr),
            "systor" => no_param(TraceFormat::Systor),
            "tencent" => no_param(TraceFormat::Tencent),
            "fiu" => no_param(TraceFormat::Fiu),
            "vscsi-csv" => no_param(TraceFormat::VscsiCsv),
            "disksim" => no_param(TraceFormat::Disksim),
            "arc" => no_param(TraceFormat::Arc),
            "fio" => no_param(TraceFormat::Fio),
            "blkparse" => match param {
                None => Ok(TraceFormat::BLKPARSE),
                Some((key, value)) if key == "action" => match value.as_bytes() {
                    [letter] if letter.is_ascii_alphabetic() => Ok(TraceFormat::Blkparse { action: *letter }),
                    _ => Err(FormatNameError(format!(
                        "blkparse action must be one blktrace action letter \
                         (e.g. Q, D, C), found `{value}`"
                    ))),
                },
                Some((key, _)) => Err(FormatNameError(format!(
                    "unknown blkparse parameter `{key}` (expected `action=X`)"
                ))),
            },
            "lba" => match param {
                None => Ok(TraceFormat::LBA),
                Some((key, value)) if key == "block" => match value.parse::<u64>() {
                    Ok(block_bytes) if block_bytes > 0 => Ok(TraceFormat::Lba { block_bytes }),
                    _ => Err(FormatNameError(format!(
                        "lba block size must be a positive number of bytes, found `{value}`"
                    ))),
                },
                Some((key, _)) => Err(FormatNameError(format!(
                    "unknown lba parameter `{key}` (expected `block=N`)"
                ))),
            },
            _ => Err(FormatNameError(format!(
                "unknown trace format `{s}`; {}",
                valid_names()
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let all = [
            TraceFormat::Msr,
            TraceFormat::Systor,
            TraceFormat::Tencent,
            TraceFormat::Fiu,
            TraceFormat::VscsiCsv,
            TraceFormat::Disksim,
            TraceFormat::Arc,
            TraceFormat::BLKPARSE,
            TraceFormat::Blkparse { action: b'D' },
            TraceFormat::Fio,
            TraceFormat::LBA,
            TraceFormat::Lba { block_bytes: 4096 },
        ];
        for format in all {
            let text = format.to_string();
            assert_eq!(text.parse::<TraceFormat>(), Ok(format), "{text}");
        }
        for name in FORMAT_NAMES {
            let format: TraceFormat = name.parse().unwrap();
            assert_eq!(format.to_string(), *name);
        }
    }

    #[test]
    fn parameters() {
        assert_eq!(
            "blkparse:action=D".parse::<TraceFormat>(),
            Ok(TraceFormat::Blkparse { action: b'D' })
        );
        assert_eq!(
            "blkparse:action=Q".parse::<TraceFormat>(),
            Ok(TraceFormat::BLKPARSE)
        );
        assert_eq!(
            "blkparse:action=Q".parse::<TraceFormat>().unwrap().to_string(),
            "blkparse"
        );
        assert_eq!(
            "LBA:block=4096".parse::<TraceFormat>(),
            Ok(TraceFormat::Lba { block_bytes: 4096 })
        );
        assert!("lba:block=0".parse::<TraceFormat>().is_err());
        assert!("lba:block=x".parse::<TraceFormat>().is_err());
        assert!("lba:size=4096".parse::<TraceFormat>().is_err());
        assert!("blkparse:action=QQ".parse::<TraceFormat>().is_err());
        assert!("msr:x=1".parse::<TraceFormat>().is_err());
    }

    #[test]
    fn unknown_lists_names() {
        let err = "nope".parse::<TraceFormat>().unwrap_err().to_string();
        for name in FORMAT_NAMES {
            assert!(err.contains(name), "{err}");
        }
    }
}
