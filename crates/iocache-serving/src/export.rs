//! The engine as an NBD export: what the server calls for each command.

use std::sync::Arc;

use iocache_nbd::{Export, ExportError, InPlace};

use iocache_engine::{Engine, EngineError, Volume, Zeroing};

use crate::cell::EngineCell;
use crate::config::DiscardMode;

/// Serves one volume of an engine over NBD.
pub struct EngineExport {
    cell: Arc<EngineCell>,
    /// The volume's name (its handle is the cell's engine's).
    volume: String,
    size_bytes: u64,
    description: Option<String>,
    read_only: bool,
    discard: DiscardMode,
}

impl EngineExport {
    /// Serves the engine's default volume.
    pub fn new(engine: Arc<Engine>, description: Option<String>) -> Self {
        let volume = engine.default_volume().clone();
        EngineExport::for_volume(engine, volume, description)
    }

    /// Serves `volume` of `engine`; once it is detached, every request gets
    /// ESHUTDOWN.
    pub fn for_volume(engine: Arc<Engine>, volume: Volume, description: Option<String>) -> Self {
        EngineExport::in_cell(Arc::new(EngineCell::new(engine)), &volume, description)
    }

    /// Serves `volume` of whichever engine `cell` holds (the volume of that
    /// name); once it is detached, every request gets ESHUTDOWN.
    pub fn in_cell(cell: Arc<EngineCell>, volume: &Volume, description: Option<String>) -> Self {
        EngineExport {
            cell,
            volume: volume.name().to_string(),
            size_bytes: volume.size_bytes(),
            description,
            read_only: false,
            discard: DiscardMode::default(),
        }
    }

    /// What a client's TRIM does (the default passes it down).
    pub fn with_discard(mut self, discard: DiscardMode) -> Self {
        self.discard = discard;
        self
    }

    /// Serves the volume read-only: the NBD server advertises
    /// NBD_FLAG_READ_ONLY and answers writes, trims and write-zeroes with
    /// EPERM before they reach the engine.
    pub fn with_read_only(mut self, read_only: bool) -> Self {
        self.read_only = read_only;
        self
    }

    /// The engine in force now.
    pub fn engine(&self) -> Arc<Engine> {
        self.cell.engine()
    }

    /// The name of the volume served.
    pub fn volume_name(&self) -> &str {
        &self.volume
    }

    /// Runs `f` with the engine in force and this export's volume, the
    /// engine held (not replaced) until it returns.
    fn with<T>(&self, f: impl FnOnce(&Engine, &Volume) -> Result<T, EngineError>) -> Result<T, ExportError> {
        let current = self.cell.read();
        let volume = current.volume(&self.volume).ok_or(ExportError::Shutdown)?;
        f(&current.engine, volume).map_err(to_export_error)
    }
}

fn to_export_error(e: EngineError) -> ExportError {
    match e {
        EngineError::OutOfRange { .. } => ExportError::OutOfRange,
        EngineError::Unaligned { offset, length } => ExportError::Invalid(format!(
            "offset {offset} and length {length} must be multiples of 512"
        )),
        EngineError::Shutdown | EngineError::UnknownVolume(_) => ExportError::Shutdown,
        EngineError::Device(d) => ExportError::Io(std::io::Error::other(d.to_string())),
        EngineError::NotSupported(_) => ExportError::NotSupported,
        other => ExportError::Io(std::io::Error::other(other.to_string())),
    }
}

impl Export for EngineExport {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ExportError> {
        self.with(|engine, volume| engine.read_with(volume, offset, buf))
    }

    fn read_in_place(&self, offset: u64, buf: &mut [u8], in_place: InPlace<'_>) -> Result<bool, ExportError> {
        self.with(|engine, volume| engine.read_in_place_with(volume, offset, buf, in_place))
    }

    fn read_is_quick(&self, offset: u64, length: u64) -> bool {
        let current = self.cell.read();
        current
            .volume(&self.volume)
            .is_some_and(|volume| current.engine.read_would_hit(volume, offset, length))
    }

    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), ExportError> {
        self.with(|engine, volume| engine.write_with(volume, offset, data, fua))
    }

    fn flush(&self) -> Result<(), ExportError> {
        self.with(|engine, volume| engine.flush_with(volume))
    }

    /// Per [`DiscardMode`]: the lines wholly inside leave the cache, dirty
    /// ones included, and the backend discards the range (or keeps it).
    fn trim(&self, offset: u64, length: u64) -> Result<(), ExportError> {
        let pass_down = match self.discard {
            DiscardMode::Ignore => return Ok(()),
            DiscardMode::Cache => false,
            DiscardMode::PassDown => true,
        };
        self.with(|engine, volume| engine.discard_with(volume, offset, length, pass_down))
    }

    /// Whole lines dropped and zeroed on the backend in one operation; the
    /// partial lines at the ends written with zeroes.
    fn write_zeroes(&self, offset: u64, length: u64, fua: bool, no_hole: bool) -> Result<(), ExportError> {
        let zeroing = Zeroing {
            fua,
            keep_allocated: no_hole,
            fast_only: false,
        };
        self.with(|engine, volume| engine.write_zeroes_with(volume, offset, length, zeroing))
    }

    fn can_cache(&self) -> bool {
        true
    }

    /// NBD_CMD_CACHE: the range read through the cache, as the promotion
    /// policy admits lines on a read.
    fn cache(&self, offset: u64, length: u64) -> Result<(), ExportError> {
        self.with(|engine, volume| engine.warm_range(volume, offset, length))
    }

    /// `base:allocation`: the backend's holes, less the lines the cache
    /// holds dirty data of.
    fn block_status(&self, offset: u64, length: u32) -> Result<Vec<iocache_nbd::proto::Extent>, ExportError> {
        use iocache_nbd::proto::{Extent, NBD_STATE_HOLE, NBD_STATE_ZERO};
        let extents = self.with(|engine, volume| engine.allocation(volume, offset, u64::from(length)))?;
        Ok(extents
            .into_iter()
            .map(|e| Extent {
                // Within a request of `length` bytes.
                length: e.length_bytes as u32,
                flags: if e.hole {
                    NBD_STATE_HOLE | NBD_STATE_ZERO
                } else {
                    0
                },
            })
            .collect())
    }

    fn zeroes_fast(&self) -> bool {
        let current = self.cell.read();
        current
            .volume(&self.volume)
            .is_some_and(|volume| current.engine.zeroes_fast(volume))
    }

    /// A flush on any connection covers writes completed on every connection.
    fn can_multi_conn(&self) -> bool {
        true
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn block_sizes(&self) -> (u32, u32, u32) {
        (512, 4096, 32 << 20)
    }

    fn description(&self) -> Option<String> {
        self.description.clone()
    }
}
