//! Device models: what one I/O costs on the cache device or the backend, and
//! how concurrent I/Os share the device.
//!
//! A [`DeviceSpec`] is either a queueing server ([`QueueSpec`]) or an SSD
//! with flash internals ([`FlashSpec`], see `flash.rs`).
//!
//! # The queueing server
//!
//! An op of `b` bytes costs `fixed + b/1024 × per_kib` nanoseconds when the
//! device is idle, with separate [`OpCost`]s for reads and writes. Under
//! load, the two parts queue separately:
//!
//! - the fixed part (command processing, media access) runs on one of `k`
//!   identical *servers* that share **one FIFO queue** (an M/G/k queue when
//!   arrivals are Poisson): an op starts on the server that frees first, at
//!   `max(arrival, that server's free time)`;
//! - the size-dependent part then runs on the device's single *data channel*
//!   (its interface or internal bus), also first come first served, and the
//!   op keeps its server until its transfer is done.
//!
//! So `k` bounds the number of ops in progress (the device's internal
//! parallelism or queue slots) and `per_kib` bounds the device's bandwidth
//! (1 KiB per `per_kib` ns) however many servers there are, while an idle
//! device serves one op in exactly `fixed + size × per_kib`. With
//! `per_kib = 0` the model is exactly a FIFO k-server queue, which the tests
//! check against queueing theory.
//!
//! Ops must reach [`Device::schedule`] in nondecreasing arrival order (the
//! engine guarantees it); the data channel then serves transfers in that
//! order too, which differs from true FIFO-by-readiness only when a later op's
//! fixed part ends before an earlier one's (a read and a write of different
//! fixed costs overlapping) and the channel is busy.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use serde::Serialize;

use super::flash::{FlashDevice, FlashSpec};
use super::hdd::{HddDevice, HddSpec};
use super::TimingError;

/// Direction of one device I/O.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Dir {
    Read,
    Write,
}

/// The cost of one read or write: `fixed_ns + bytes / 1024 × per_kib_ns`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct OpCost {
    /// Per-op time holding one server (command, seek, media access), in ns.
    pub fixed_ns: f64,
    /// Transfer time per KiB on the device's data channel, in ns.
    pub per_kib_ns: f64,
}

impl OpCost {
    pub const fn new(fixed_ns: f64, per_kib_ns: f64) -> Self {
        OpCost { fixed_ns, per_kib_ns }
    }

    pub fn fixed(&self) -> u64 {
        self.fixed_ns.round() as u64
    }

    pub fn transfer(&self, bytes: u64) -> u64 {
        (bytes as f64 / 1024.0 * self.per_kib_ns).round() as u64
    }

    /// The time an idle device takes for `bytes`.
    pub fn service(&self, bytes: u64) -> u64 {
        self.fixed() + self.transfer(bytes)
    }
}

/// A queueing-server device: `servers` parallel servers sharing one FIFO
/// queue, and one data channel (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct QueueSpec {
    pub servers: u32,
    pub read: OpCost,
    pub write: OpCost,
}

impl QueueSpec {
    pub fn cost(&self, dir: Dir) -> &OpCost {
        match dir {
            Dir::Read => &self.read,
            Dir::Write => &self.write,
        }
    }

    pub fn validate(&self) -> Result<(), TimingError> {
        if self.servers == 0 || self.servers > 1 << 20 {
            return Err(TimingError::BadParameter(format!(
                "servers must be 1..={}, not {}",
                1 << 20,
                self.servers
            )));
        }
        for (what, c) in [("read", &self.read), ("write", &self.write)] {
            for v in [c.fixed_ns, c.per_kib_ns] {
                if !v.is_finite() || !(0.0..=1e12).contains(&v) {
                    return Err(TimingError::BadParameter(format!(
                        "{what} cost must be finite, >= 0 and <= 1e12 ns, not {v}"
                    )));
                }
            }
        }
        Ok(())
    }
}

/// What kind of model a device uses.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "model", rename_all = "lowercase")]
pub enum DeviceModel {
    Queue(QueueSpec),
    Flash(FlashSpec),
    /// A disk head whose cost depends on the seek (`hdd.rs`).
    Hdd(HddSpec),
}

/// A device's model and the name it was chosen by.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DeviceSpec {
    pub name: String,
    pub model: DeviceModel,
}

impl DeviceSpec {
    pub fn queue(name: impl Into<String>, spec: QueueSpec) -> Self {
        DeviceSpec {
            name: name.into(),
            model: DeviceModel::Queue(spec),
        }
    }

    /// One server with the same fixed cost for reads and writes and no
    /// transfer cost: the textbook single-server queue.
    pub fn fixed(name: impl Into<String>, servers: u32, service_ns: u64) -> Self {
        let cost = OpCost::new(service_ns as f64, 0.0);
        Self::queue(
            name,
            QueueSpec {
                servers,
                read: cost,
                write: cost,
            },
        )
    }

    pub fn validate(&self) -> Result<(), TimingError> {
        match &self.model {
            DeviceModel::Queue(q) => q.validate(),
            DeviceModel::Flash(f) => f.validate(),
            DeviceModel::Hdd(h) => h.validate(),
        }
    }

    /// Parallel servers: queue servers, or flash chips.
    pub fn servers(&self) -> u32 {
        match &self.model {
            DeviceModel::Queue(q) => q.servers,
            DeviceModel::Flash(f) => f.channels * f.chips_per_channel,
            DeviceModel::Hdd(_) => 1,
        }
    }

    /// What one op of `bytes` costs on the idle device (flash: a fresh
    /// page-aligned op without garbage collection).
    pub fn idle_service_ns(&self, dir: Dir, bytes: u64) -> u64 {
        match &self.model {
            DeviceModel::Queue(q) => q.cost(dir).service(bytes),
            DeviceModel::Flash(f) => f.idle_service_ns(dir, bytes),
            DeviceModel::Hdd(h) => h.idle_service_ns(dir, bytes),
        }
    }
}

/// When one op ran on a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Scheduled {
    /// When the device started working on it (its wait ends).
    pub start_ns: u64,
    /// When it completed.
    pub end_ns: u64,
}

/// Receives the intervals during which one server (or chip) is busy.
pub trait BusySink {
    fn busy(&mut self, start_ns: u64, end_ns: u64);
}

impl<F: FnMut(u64, u64)> BusySink for F {
    fn busy(&mut self, start_ns: u64, end_ns: u64) {
        self(start_ns, end_ns)
    }
}

/// A queueing-server device in operation.
#[derive(Debug)]
pub struct QueueDevice {
    spec: QueueSpec,
    /// When each server frees; a min-heap.
    free: BinaryHeap<Reverse<u64>>,
    channel_free: u64,
}

impl QueueDevice {
    pub fn new(spec: QueueSpec) -> Self {
        QueueDevice {
            spec,
            free: (0..spec.servers).map(|_| Reverse(0)).collect(),
            channel_free: 0,
        }
    }

    pub fn schedule(&mut self, at: u64, dir: Dir, bytes: u64, sink: &mut impl BusySink) -> Scheduled {
        let cost = *self.spec.cost(dir);
        let Reverse(free) = self.free.pop().expect("at least one server");
        let start = at.max(free);
        let fixed_end = start + cost.fixed();
        let transfer = cost.transfer(bytes);
        let end = if transfer == 0 {
            fixed_end
        } else {
            let t = fixed_end.max(self.channel_free) + transfer;
            self.channel_free = t;
            t
        };
        self.free.push(Reverse(end));
        sink.busy(start, end);
        Scheduled {
            start_ns: start,
            end_ns: end,
        }
    }
}

/// A device in operation, of either model.
#[derive(Debug)]
pub enum Device {
    Queue(QueueDevice),
    Flash(Box<FlashDevice>),
    Hdd(HddDevice),
}

impl Device {
    pub fn new(spec: &DeviceSpec) -> Result<Self, TimingError> {
        spec.validate()?;
        Ok(match &spec.model {
            DeviceModel::Queue(q) => Device::Queue(QueueDevice::new(*q)),
            DeviceModel::Flash(f) => Device::Flash(Box::new(FlashDevice::new(f.clone())?)),
            DeviceModel::Hdd(h) => Device::Hdd(HddDevice::new(*h)),
        })
    }

    /// Runs one op arriving at `at` on bytes `[address, address + bytes)` of
    /// the device. Arrivals must not decrease from call to call.
    pub fn schedule(
        &mut self,
        at: u64,
        dir: Dir,
        address: u64,
        bytes: u64,
        sink: &mut impl BusySink,
    ) -> Scheduled {
        match self {
            Device::Queue(q) => q.schedule(at, dir, bytes, sink),
            Device::Flash(f) => f.schedule(at, dir, address, bytes, sink),
            Device::Hdd(h) => h.schedule(at, dir, address, bytes, sink),
        }
    }

    /// Zeroes the model's own counters (not its state).
    pub fn reset_counters(&mut self) {
        match self {
            Device::Queue(_) => {}
            Device::Flash(f) => f.reset_counters(),
            Device::Hdd(h) => h.reset_counters(),
        }
    }

    /// The model's own counters (flash: garbage collection), by name.
    pub fn counters(&self) -> Vec<(&'static str, u64)> {
        match self {
            Device::Queue(_) => Vec::new(),
            Device::Flash(f) => f.counters(),
            Device::Hdd(h) => h.counters(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(dev: &mut QueueDevice, ops: &[(u64, Dir, u64)]) -> Vec<Scheduled> {
        ops.iter()
            .map(|&(at, dir, bytes)| dev.schedule(at, dir, bytes, &mut |_, _| {}))
            .collect()
    }

    #[test]
    fn idle_service_is_fixed_plus_size_times_per_kib() {
        let cost = OpCost::new(100.0, 10.0);
        let mut dev = QueueDevice::new(QueueSpec {
            servers: 1,
            read: cost,
            write: OpCost::new(50.0, 0.0),
        });
        // 8 KiB read at 0: 100 + 8 × 10 = 180. Write at 1000: 50.
        let s = run(&mut dev, &[(0, Dir::Read, 8192), (1000, Dir::Write, 4096)]);
        assert_eq!(
            s[0],
            Scheduled {
                start_ns: 0,
                end_ns: 180
            }
        );
        assert_eq!(
            s[1],
            Scheduled {
                start_ns: 1000,
                end_ns: 1050
            }
        );
    }

    /// Four servers, one channel at 100 ns/KiB: four 1 KiB reads with fixed
    /// 10 ns arriving together all finish their fixed part at 10, then
    /// transfer one after the other: 110, 210, 310, 410.
    #[test]
    fn the_data_channel_is_shared() {
        let mut dev = QueueDevice::new(QueueSpec {
            servers: 4,
            read: OpCost::new(10.0, 100.0),
            write: OpCost::new(10.0, 100.0),
        });
        let ends: Vec<u64> = run(&mut dev, &[(0, Dir::Read, 1024); 4])
            .iter()
            .map(|s| s.end_ns)
            .collect();
        assert_eq!(ends, [110, 210, 310, 410]);
    }
}
