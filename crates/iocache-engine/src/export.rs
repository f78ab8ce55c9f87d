//! The engine as an NBD export: what the server calls for each command.

use std::sync::Arc;

use iocache_nbd::{Export, ExportError};

use crate::engine::{Engine, EngineError};

/// Serves one engine (one cached volume) over NBD.
pub struct EngineExport {
    engine: Arc<Engine>,
    description: Option<String>,
}

impl EngineExport {
    pub fn new(engine: Arc<Engine>, description: Option<String>) -> Self {
        EngineExport { engine, description }
    }

    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }
}

fn to_export_error(e: EngineError) -> ExportError {
    match e {
        EngineError::OutOfRange { .. } => ExportError::OutOfRange,
        EngineError::Unaligned { offset, length } => ExportError::Invalid(format!(
            "offset {offset} and length {length} must be multiples of 512"
        )),
        EngineError::Shutdown => ExportError::Shutdown,
        EngineError::Device(d) => ExportError::Io(std::io::Error::other(d.to_string())),
        other => ExportError::Io(std::io::Error::other(other.to_string())),
    }
}

impl Export for EngineExport {
    fn size_bytes(&self) -> u64 {
        self.engine.size_bytes()
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ExportError> {
        self.engine.read(offset, buf).map_err(to_export_error)
    }

    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), ExportError> {
        self.engine.write(offset, data, fua).map_err(to_export_error)
    }

    fn flush(&self) -> Result<(), ExportError> {
        self.engine.flush().map_err(to_export_error)
    }

    /// A flush on any connection covers writes completed on every connection.
    fn can_multi_conn(&self) -> bool {
        true
    }

    fn block_sizes(&self) -> (u32, u32, u32) {
        (512, 4096, 32 << 20)
    }

    fn description(&self) -> Option<String> {
        self.description.clone()
    }
}
