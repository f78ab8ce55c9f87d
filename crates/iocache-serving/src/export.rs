//! The engine as an NBD export: what the server calls for each command.

use std::sync::Arc;

use iocache_nbd::{Export, ExportError};

use iocache_engine::{Engine, EngineError, Volume};

/// Serves one volume of an engine over NBD.
pub struct EngineExport {
    engine: Arc<Engine>,
    volume: Volume,
    description: Option<String>,
    read_only: bool,
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
        EngineExport {
            engine,
            volume,
            description,
            read_only: false,
        }
    }

    /// Serves the volume read-only: the NBD server advertises
    /// NBD_FLAG_READ_ONLY and answers writes, trims and write-zeroes with
    /// EPERM before they reach the engine.
    pub fn with_read_only(mut self, read_only: bool) -> Self {
        self.read_only = read_only;
        self
    }

    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    pub fn volume(&self) -> &Volume {
        &self.volume
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
        other => ExportError::Io(std::io::Error::other(other.to_string())),
    }
}

impl Export for EngineExport {
    fn size_bytes(&self) -> u64 {
        self.volume.size_bytes()
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ExportError> {
        self.engine
            .read_with(&self.volume, offset, buf)
            .map_err(to_export_error)
    }

    fn read_is_quick(&self, offset: u64, length: u64) -> bool {
        self.engine.read_would_hit(&self.volume, offset, length)
    }

    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), ExportError> {
        self.engine
            .write_with(&self.volume, offset, data, fua)
            .map_err(to_export_error)
    }

    fn flush(&self) -> Result<(), ExportError> {
        self.engine.flush_with(&self.volume).map_err(to_export_error)
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
