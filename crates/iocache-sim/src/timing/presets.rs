//! Device presets from the papers' tables, and the parser for device names
//! with overrides (`sata-ssd`, `hdd:servers=2`, `flash:capacity=8GiB`).
//!
//! Every number below comes from one of the papers in the project's paper
//! set, cited where it is used; how a service time was derived from a
//! throughput or latency is stated with the derivation. Numbers that are
//! assumptions, not taken from a paper, say so. `docs/timing-model.md` has
//! the same table.
//!
//! # Derivations
//!
//! **ASPLOS'23 Table 1** (Rearchitecting I/O caches, Table 1) gives, per
//! device, the 4 KiB random-read latency `L` and maximum 4 KiB IOPS for reads
//! `Xr` and writes `Xw`, nothing about bandwidth. We take the IOPS limits as
//! the data channel's limits: `per_kib = 1 s / (X × 4)`, so 4 KiB ops
//! saturate at exactly `X`; the read's fixed part is the rest of the latency,
//! `fixed_r = L − 4 × per_kib_r`; the servers are what Little's law needs to
//! sustain `Xr` at latency `L` (and `Xw` at the write's service time),
//! `k = ⌈max(Xr × L, Xw × (fixed_w + 4 × per_kib_w))⌉`; the table gives no
//! write latency, so writes get the read's fixed part (an assumption).
//!
//! **ReCA Table 1** (TPDS'18, "Testbed configuration", measured) gives
//! sequential bandwidth `B` and random 4 KiB IOPS `X` per direction. Without
//! a latency or queue depth, we use one server whose 4 KiB service time is
//! `1/X`: `per_kib = 1 KiB / B`, `fixed = 1/X − 4 × per_kib`.
//!
//! **SYSTOR'14 Table 3** (raw flash latencies, µs, fio with direct I/O,
//! apparently at queue depth 1) gives mean random read/write latencies; one
//! server with those as the 4 KiB service times. The paper gives no bandwidth,
//! so the per-KiB part is taken from ReCA Table 1's SATA SSD (an assumption
//! that only matters for large ops).

use iocache_core::units::parse_byte_size;

use super::device::{DeviceModel, DeviceSpec, OpCost, QueueSpec};
use super::flash::FlashSpec;
use super::hdd::HddSpec;
use super::TimingError;

/// A named device preset.
pub struct Preset {
    pub name: &'static str,
    pub summary: &'static str,
    /// The paper and table the numbers come from.
    pub source: &'static str,
    pub build: fn() -> DeviceModel,
}

const SEC: f64 = 1e9;

/// ASPLOS'23 Table 1 derivation (see the module doc).
fn from_latency_and_iops(latency_ns: f64, read_iops: f64, write_iops: f64) -> QueueSpec {
    let per_kib_r = SEC / (read_iops * 4.0);
    let per_kib_w = SEC / (write_iops * 4.0);
    let fixed = latency_ns - 4.0 * per_kib_r;
    // Enough servers for both directions' IOPS at their 4 KiB service times.
    let write_service = fixed + 4.0 * per_kib_w;
    let servers = (read_iops * latency_ns / SEC).max(write_iops * write_service / SEC);
    QueueSpec {
        servers: servers.ceil() as u32,
        read: OpCost::new(fixed, per_kib_r),
        write: OpCost::new(fixed, per_kib_w),
    }
}

/// ReCA Table 1 derivation: one server; bandwidths in MB/s (10^6 B/s).
fn from_iops_and_bandwidth(read_iops: f64, write_iops: f64, read_mbps: f64, write_mbps: f64) -> QueueSpec {
    let per_kib_r = 1024.0 * SEC / (read_mbps * 1e6);
    let per_kib_w = 1024.0 * SEC / (write_mbps * 1e6);
    QueueSpec {
        servers: 1,
        read: OpCost::new(SEC / read_iops - 4.0 * per_kib_r, per_kib_r),
        write: OpCost::new(SEC / write_iops - 4.0 * per_kib_w, per_kib_w),
    }
}

/// SYSTOR'14 Table 3 derivation: one server, 4 KiB latencies, ReCA's SATA bandwidth.
fn from_latencies(read_ns: f64, write_ns: f64) -> QueueSpec {
    let bw = from_iops_and_bandwidth(RECA_SSD_IOPS.0, RECA_SSD_IOPS.1, RECA_SSD_MBPS.0, RECA_SSD_MBPS.1);
    QueueSpec {
        servers: 1,
        read: OpCost::new(read_ns - 4.0 * bw.read.per_kib_ns, bw.read.per_kib_ns),
        write: OpCost::new(write_ns - 4.0 * bw.write.per_kib_ns, bw.write.per_kib_ns),
    }
}

/// ASPLOS'23 Table 1, Micron 5100 Eco SATA SSD: 150 µs, 93K/30K IOPS.
fn sata_ssd() -> QueueSpec {
    from_latency_and_iops(150_000.0, 93e3, 30e3)
}

/// ReCA Table 1, Samsung 850 PRO: 20k/30k random IOPS, 480/440 MB/s sequential.
const RECA_SSD_IOPS: (f64, f64) = (20e3, 30e3);
const RECA_SSD_MBPS: (f64, f64) = (480.0, 440.0);

/// The RAID-5 backend of ASPLOS'23 §4 ("9× Samsung SM863a ... RAID5(8+1)"):
/// nine SATA SSDs. The paper gives no per-drive numbers; each drive is the
/// Table 1 SATA SSD (the same class). Reads spread over all nine drives:
/// 9 × the servers and 9 × the bandwidth. A small write is a
/// read-modify-write of data and parity (two drives each read and write):
/// its fixed part is a drive's read then write, and per KiB it moves 2 KiB of
/// drive reads and 2 KiB of drive writes spread over nine drives. Full-stripe
/// writes and the RAID controller's write cache are not modelled.
fn ssd_raid5() -> QueueSpec {
    let drive = sata_ssd();
    let drives = 9.0;
    QueueSpec {
        servers: drive.servers * 9,
        read: OpCost::new(drive.read.fixed_ns, drive.read.per_kib_ns / drives),
        write: OpCost::new(
            drive.read.fixed_ns + drive.write.fixed_ns,
            2.0 * (drive.read.per_kib_ns + drive.write.per_kib_ns) / drives,
        ),
    }
}

/// The presets, by name.
pub static PRESETS: &[Preset] = &[
    Preset {
        name: "sata-ssd",
        summary: "SATA NAND SSD (Micron 5100 Eco): 150 us 4K read, 93K/30K IOPS",
        source: "ASPLOS'23 Table 1",
        build: || DeviceModel::Queue(sata_ssd()),
    },
    Preset {
        name: "optane",
        summary: "Optane SSD (Intel P5800X): 6 us 4K read, 1.5M/1.6M IOPS",
        source: "ASPLOS'23 Table 1",
        build: || DeviceModel::Queue(from_latency_and_iops(6_000.0, 1.5e6, 1.6e6)),
    },
    Preset {
        name: "nvdimm",
        summary: "NVDIMM (Intel PMem 200): <1 us 4K read (1 us used), 1.9M/560K IOPS",
        source: "ASPLOS'23 Table 1",
        build: || DeviceModel::Queue(from_latency_and_iops(1_000.0, 1.9e6, 560e3)),
    },
    Preset {
        name: "ramdisk",
        summary: "DDR4 RAM disk (brd): <3 us 4K read (3 us used), 1.8M/1.4M IOPS",
        source: "ASPLOS'23 Table 1",
        build: || DeviceModel::Queue(from_latency_and_iops(3_000.0, 1.8e6, 1.4e6)),
    },
    Preset {
        name: "nvme",
        summary: "NAND NVMe SSD: 6x the SATA SSD's IOPS (558K/180K); 80 us 4K read (assumed)",
        source: "ASPLOS'23 §2.2 text (\"6x to 14x\" SATA); latency is an assumption",
        build: || DeviceModel::Queue(from_latency_and_iops(80_000.0, 6.0 * 93e3, 6.0 * 30e3)),
    },
    Preset {
        name: "ssd-raid5",
        summary: "RAID5(8+1) of SATA SSDs, each the sata-ssd preset, read-modify-write small writes",
        source: "ASPLOS'23 §4 setup + Table 1 (derived)",
        build: || DeviceModel::Queue(ssd_raid5()),
    },
    Preset {
        name: "ssd",
        summary: "SATA SSD (Samsung 850 PRO): 20k/30k IOPS, 480/440 MB/s, one server",
        source: "ReCA (TPDS'18) Table 1",
        build: || {
            DeviceModel::Queue(from_iops_and_bandwidth(
                RECA_SSD_IOPS.0,
                RECA_SSD_IOPS.1,
                RECA_SSD_MBPS.0,
                RECA_SSD_MBPS.1,
            ))
        },
    },
    Preset {
        name: "hdd",
        summary: "7.2K HDD (WD Red Pro): 80/150 random IOPS, 120 MB/s, one server",
        source: "ReCA (TPDS'18) Table 1",
        build: || DeviceModel::Queue(from_iops_and_bandwidth(80.0, 150.0, 120.0, 120.0)),
    },
    Preset {
        name: "hdd-reca",
        summary:
            "HDD (WD Red Pro) whose cost depends on the seek: sequential, strided (<8 KiB gap) or random",
        source: "ReCA (TPDS'18) Table 1 and §3.1's Fig. 5 ratios (hdd.rs)",
        build: || DeviceModel::Hdd(HddSpec::reca()),
    },
    Preset {
        name: "sata-flash",
        summary: "SATA MLC flash (Intel, 120 GB): 190.5/54.5 us random 4K read/write, one server",
        source: "SYSTOR'14 Table 3 (bandwidth from ReCA Table 1)",
        build: || DeviceModel::Queue(from_latencies(190_500.0, 54_500.0)),
    },
    Preset {
        name: "pcie-flash",
        summary: "PCIe MLC flash (OCZ, 240 GB): 239.9/57.1 us random 4K read/write, one server",
        source: "SYSTOR'14 Table 3 (bandwidth from ReCA Table 1)",
        build: || DeviceModel::Queue(from_latencies(239_900.0, 57_100.0)),
    },
    Preset {
        name: "iscsi-hdd",
        summary: "remote 7.2K SAS disk over iSCSI/GbE: 0.3 ms read, 0.4 ms write, 125 MB/s",
        source: "SYSTOR'14 §3.4 testbed, §5 text (no-cache latencies, Figs. 9-10)",
        build: || {
            // GbE: 1 KiB per 1024 / 125e6 s; fixed = latency − one 4 KiB transfer.
            let per_kib = 1024.0 * SEC / 125e6;
            DeviceModel::Queue(QueueSpec {
                servers: 1,
                read: OpCost::new(300_000.0 - 4.0 * per_kib, per_kib),
                write: OpCost::new(400_000.0 - 4.0 * per_kib, per_kib),
            })
        },
    },
    Preset {
        name: "flash",
        summary: "SSD flash internals: 8 channels x 2 chips, page FTL, greedy GC (SSDsim settings)",
        source: "ICPP'22 Req-block Table 1 (over-provisioning assumed 15 %)",
        build: || DeviceModel::Flash(FlashSpec::req_block()),
    },
];

/// The preset called `name`.
pub fn preset(name: &str) -> Option<DeviceSpec> {
    PRESETS.iter().find(|p| p.name == name).map(|p| DeviceSpec {
        name: p.name.to_string(),
        model: (p.build)(),
    })
}

/// Parses a duration for a device parameter: a bare number is nanoseconds,
/// otherwise a number with a unit as [`iocache_core::units::parse_duration_ns`]
/// takes it (`1s`, `2.5ms`, `75us`).
pub fn parse_duration_ns(s: &str) -> Result<u64, TimingError> {
    let t = s.trim();
    if let Ok(nanos) = t.parse::<u64>() {
        return Ok(nanos);
    }
    iocache_core::units::parse_duration_ns(t).map_err(|e| TimingError::BadParameter(e.to_string()))
}

fn parse_f64(key: &str, v: &str) -> Result<f64, TimingError> {
    v.parse::<f64>()
        .ok()
        .filter(|x| x.is_finite())
        .ok_or_else(|| TimingError::BadParameter(format!("{key}: bad number {v:?}")))
}

fn parse_u32(key: &str, v: &str) -> Result<u32, TimingError> {
    v.parse::<u32>()
        .map_err(|_| TimingError::BadParameter(format!("{key}: bad integer {v:?}")))
}

/// Parses a device: a preset name or `queue`, then optional `:key=value`
/// overrides. Queue devices take `servers=N`, `read=TIME`, `write=TIME`
/// (fixed parts), `read-kib=TIME`, `write-kib=TIME` (per KiB); `queue` alone
/// is one server costing nothing, to be set with those keys. The flash device
/// takes `channels`, `chips` (per channel), `page=SIZE`, `block=PAGES`,
/// `read`, `program`, `erase` (times), `xfer=NS_PER_BYTE`, `gc=FRACTION`,
/// `op=FRACTION`, `capacity=SIZE`. Example: `sata-ssd:servers=32`,
/// `flash:capacity=16GiB:op=0.2`, `queue:servers=4:read=100us:write=50us`.
pub fn parse_device(s: &str) -> Result<DeviceSpec, TimingError> {
    let mut parts = s.split(':');
    let name = parts.next().unwrap_or("").trim();
    let mut spec = if name == "queue" {
        DeviceSpec::fixed("queue", 1, 0)
    } else {
        preset(name).ok_or_else(|| {
            TimingError::BadParameter(format!(
                "unknown device {name:?}; known: queue, {}",
                PRESETS.iter().map(|p| p.name).collect::<Vec<_>>().join(", ")
            ))
        })?
    };
    let mut overridden = false;
    for part in parts {
        let (key, value) = part
            .split_once('=')
            .ok_or_else(|| TimingError::BadParameter(format!("expected key=value, not {part:?}")))?;
        let (key, value) = (key.trim(), value.trim());
        overridden = true;
        match &mut spec.model {
            DeviceModel::Queue(q) => match key {
                "servers" => q.servers = parse_u32(key, value)?,
                "read" => q.read.fixed_ns = parse_duration_ns(value)? as f64,
                "write" => q.write.fixed_ns = parse_duration_ns(value)? as f64,
                "read-kib" => q.read.per_kib_ns = parse_f64(key, value.trim_end_matches("ns"))?,
                "write-kib" => q.write.per_kib_ns = parse_f64(key, value.trim_end_matches("ns"))?,
                _ => {
                    return Err(TimingError::BadParameter(format!(
                        "unknown key {key:?} for a queue device (servers, read, write, read-kib, write-kib)"
                    )))
                }
            },
            DeviceModel::Hdd(h) => {
                let costs = match key.split_once('-') {
                    Some((_, "read")) => Some(&mut h.read),
                    Some((_, "write")) => Some(&mut h.write),
                    _ => None,
                };
                match (key, costs) {
                    ("stride", _) => {
                        h.stride_bytes =
                            parse_byte_size(value).map_err(|e| TimingError::BadParameter(e.to_string()))?
                    }
                    ("kib", _) => h.per_kib_ns = parse_f64(key, value.trim_end_matches("ns"))?,
                    (k, Some(c)) if k.starts_with("seq-") => {
                        c.sequential_ns = parse_duration_ns(value)? as f64
                    }
                    (k, Some(c)) if k.starts_with("strided-") => {
                        c.strided_ns = parse_duration_ns(value)? as f64
                    }
                    (k, Some(c)) if k.starts_with("random-") => {
                        c.random_ns = parse_duration_ns(value)? as f64
                    }
                    _ => {
                        return Err(TimingError::BadParameter(format!(
                            "unknown key {key:?} for an hdd device (stride, kib, seq-read, seq-write, \
                             strided-read, strided-write, random-read, random-write)"
                        )))
                    }
                }
            }
            DeviceModel::Flash(f) => match key {
                "channels" => f.channels = parse_u32(key, value)?,
                "chips" => f.chips_per_channel = parse_u32(key, value)?,
                "page" => {
                    f.page_bytes = u32::try_from(
                        parse_byte_size(value).map_err(|e| TimingError::BadParameter(e.to_string()))?,
                    )
                    .map_err(|_| TimingError::BadParameter(format!("page {value:?} too large")))?
                }
                "block" => f.pages_per_block = parse_u32(key, value)?,
                "read" => f.read_ns = parse_duration_ns(value)?,
                "program" => f.program_ns = parse_duration_ns(value)?,
                "erase" => f.erase_ns = parse_duration_ns(value)?,
                "xfer" => f.transfer_ns_per_byte = parse_f64(key, value.trim_end_matches("ns"))?,
                "gc" => f.gc_threshold = parse_f64(key, value)?,
                "op" => f.over_provisioning = parse_f64(key, value)?,
                "capacity" => {
                    f.capacity_bytes =
                        parse_byte_size(value).map_err(|e| TimingError::BadParameter(e.to_string()))?
                }
                _ => {
                    return Err(TimingError::BadParameter(format!(
                        "unknown key {key:?} for a flash device \
                         (channels, chips, page, block, read, program, erase, xfer, gc, op, capacity)"
                    )))
                }
            },
        }
    }
    if overridden {
        spec.name = s.to_string();
    }
    spec.validate()?;
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timing::device::Dir;

    fn queue(name: &str) -> QueueSpec {
        match preset(name).unwrap().model {
            DeviceModel::Queue(q) => q,
            DeviceModel::Flash(_) | DeviceModel::Hdd(_) => panic!("{name} is not a queue"),
        }
    }

    /// Each preset's idle 4 KiB read costs the latency of its table, and its
    /// saturation throughput (min of servers and channel) is the table's IOPS.
    #[test]
    fn presets_reproduce_their_tables() {
        // (name, 4 KiB read ns, read IOPS, write IOPS)
        let cases = [
            ("sata-ssd", 150_000, 93e3, 30e3),
            ("optane", 6_000, 1.5e6, 1.6e6),
            ("nvdimm", 1_000, 1.9e6, 560e3),
            ("ramdisk", 3_000, 1.8e6, 1.4e6),
            ("nvme", 80_000, 558e3, 180e3),
            ("ssd", 50_000, 20e3, 30e3),
            ("hdd", 12_500_000, 80.0, 150.0),
        ];
        for (name, latency, r_iops, w_iops) in cases {
            let q = queue(name);
            q.validate().unwrap();
            let got = q.read.service(4096);
            assert!(got.abs_diff(latency) <= 1, "{name}: {got} vs {latency}");
            for (cost, want) in [(&q.read, r_iops), (&q.write, w_iops)] {
                let per_op = cost.service(4096) as f64;
                let channel = cost.transfer(4096) as f64;
                let max = (q.servers as f64 * 1e9 / per_op).min(1e9 / channel);
                assert!((max - want).abs() / want < 0.01, "{name}: {max} vs {want}");
            }
        }
        let f = queue("sata-flash");
        assert_eq!((f.read.service(4096), f.write.service(4096)), (190_500, 54_500));
        let i = queue("iscsi-hdd");
        assert_eq!((i.read.service(4096), i.write.service(4096)), (300_000, 400_000));
        // RAID-5: 9 × the drive's read IOPS; small writes ≈ 9 / (2 read + 2 write channel time).
        let r = queue("ssd-raid5");
        assert_eq!(r.servers, 9 * queue("sata-ssd").servers);
        let read_max = 1e9 / r.read.transfer(4096) as f64;
        assert!((read_max - 9.0 * 93e3).abs() / (9.0 * 93e3) < 0.01, "{read_max}");
        let write_max = 1e9 / r.write.transfer(4096) as f64;
        let want = 9.0 / (2.0 / 93e3 + 2.0 / 30e3);
        assert!((write_max - want).abs() / want < 0.01, "{write_max} vs {want}");
        assert!(preset("flash").unwrap().idle_service_ns(Dir::Read, 4096) > 0);
    }

    #[test]
    fn every_preset_is_valid_and_parses() {
        for p in PRESETS {
            let spec = parse_device(p.name).unwrap();
            assert_eq!(spec.name, p.name);
            spec.validate().unwrap();
        }
        assert!(parse_device("floppy").is_err());
    }

    #[test]
    fn overrides() {
        let d = parse_device("queue:servers=4:read=100us:write=2ms:read-kib=10").unwrap();
        let DeviceModel::Queue(q) = d.model else { panic!() };
        assert_eq!(q.servers, 4);
        assert_eq!(q.read, OpCost::new(100_000.0, 10.0));
        assert_eq!(q.write, OpCost::new(2_000_000.0, 0.0));
        let d = parse_device("flash:capacity=1GiB:op=0.2:channels=4").unwrap();
        let DeviceModel::Flash(f) = d.model else { panic!() };
        assert_eq!(
            (f.capacity_bytes, f.over_provisioning, f.channels),
            (1 << 30, 0.2, 4)
        );
        assert!(parse_device("flash:op=0.05").is_err());
        assert!(parse_device("sata-ssd:servers=0").is_err());
        assert!(parse_device("sata-ssd:speed=3").is_err());
        assert!(parse_device("hdd:servers").is_err());
        let d = parse_device("hdd-reca:stride=16KiB:random-read=5ms:seq-write=1us").unwrap();
        let DeviceModel::Hdd(h) = d.model else { panic!() };
        assert_eq!(h.stride_bytes, 16 << 10);
        assert_eq!(h.read.random_ns, 5e6);
        assert_eq!(h.write.sequential_ns, 1e3);
        assert!(parse_device("hdd-reca:seek=1ms").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration_ns("1s").unwrap(), 1_000_000_000);
        assert_eq!(parse_duration_ns("2.5ms").unwrap(), 2_500_000);
        assert_eq!(parse_duration_ns("75us").unwrap(), 75_000);
        assert_eq!(parse_duration_ns("10").unwrap(), 10);
        assert_eq!(parse_duration_ns("1h").unwrap(), 3_600_000_000_000);
        assert!(parse_duration_ns("1 fortnight").is_err());
        assert!(parse_duration_ns("-1s").is_err());
        assert!(parse_duration_ns("x").is_err());
    }
}
