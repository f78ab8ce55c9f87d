//! ReCA on a serving cache: starting it with the configured table and
//! window, the line size it chose in the last run, reloading its table
//! while it runs, and its status as the admin socket answers it.

use std::path::{Path, PathBuf};

use iocache_core::reca::{CategoryTable, RecaControllerParams};
use iocache_core::units::format_byte_size;
use iocache_core::LineSize;
use iocache_device::BlockDevice;
use iocache_engine::{recorded_reca_line_size, Engine, RecaSetup, RECA_MAX_REQUESTS_PER_SECOND};
use serde_json::Value;

use crate::config::{CacheDeviceConfig, RecaConfig};
use crate::error::{refused, Result, Within};

/// Reads ReCA's category table: `path`, or the built-in one without.
/// Returns it with where it came from.
fn read_table(path: Option<&Path>) -> Result<(CategoryTable, String)> {
    let Some(path) = path else {
        return Ok((
            CategoryTable::builtin(),
            iocache_core::reca::BUILTIN_TABLE_SOURCE.into(),
        ));
    };
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).within(|| format!("reading {shown}"))?;
    let table = CategoryTable::parse(&text, &shown).map_err(|e| refused!("{e}"))?;
    Ok((table, shown))
}

/// Starts ReCA on a serving cache (`serve --adapt reca`, or `adapt =
/// "reca"` in the configuration file).
pub fn start_live(
    engine: &Engine,
    reca: &RecaConfig,
    cache: &Path,
    configured_line_size: LineSize,
    line_size_live: bool,
) -> Result<()> {
    let (table, table_source) = read_table(reca.table.as_deref())?;
    let names: Vec<&str> = table.categories.iter().map(|c| c.name.as_str()).collect();
    log::info!(
        "cache {}: ReCA on: {} categories ({}) from {table_source}, windows of {} requests, \
         at most {} requests characterized per second",
        cache.display(),
        names.len(),
        names.join(", "),
        reca.window_requests,
        RECA_MAX_REQUESTS_PER_SECOND
    );
    engine.start_reca(RecaSetup {
        table,
        table_source,
        params: RecaControllerParams {
            window_requests: reca.window_requests,
            ..RecaControllerParams::default()
        },
        max_requests_per_second: Some(RECA_MAX_REQUESTS_PER_SECOND),
        configured_line_bytes: Some(configured_line_size.bytes()),
        initial_category: None,
        line_size_live,
    })?;
    Ok(())
}

/// The line size ReCA chose in the last run of the cache on `dev`, when it
/// differs from `v`'s and `v` still configures the line size it was chosen
/// over (an operator who changed `line_size` since gets what the
/// configuration says). Logged when taken.
pub fn line_size_to_start_with(dev: &dyn BlockDevice, v: &CacheDeviceConfig) -> Result<Option<LineSize>> {
    let Some(recorded) =
        recorded_reca_line_size(dev).within(|| format!("reading the superblocks of {}", v.path.display()))?
    else {
        return Ok(None);
    };
    let configured = v.line_size.bytes();
    if recorded.configured_line_bytes != configured {
        log::info!(
            "cache {}: ReCA's line size {} of the last run was chosen over a configured {}; the \
             configuration says {} now, which is used",
            v.path.display(),
            format_byte_size(recorded.line_bytes),
            format_byte_size(recorded.configured_line_bytes),
            format_byte_size(configured)
        );
        return Ok(None);
    }
    let Ok(line_size) = LineSize::new(recorded.line_bytes) else {
        return Ok(None);
    };
    if let Err(e) = crate::start::cache_lines(v, dev.len_bytes(), recorded.line_bytes) {
        log::info!(
            "cache {}: ReCA's line size {} of the last run is not taken ({e}); the configured {} is used",
            v.path.display(),
            format_byte_size(recorded.line_bytes),
            format_byte_size(configured)
        );
        return Ok(None);
    }
    if recorded.device_line_bytes != recorded.line_bytes {
        log::info!(
            "cache {}: starting with ReCA's line size {} (configured {}; the cache holds {} lines): \
             the dirty lines are written back and the device is formatted for it",
            v.path.display(),
            format_byte_size(recorded.line_bytes),
            format_byte_size(configured),
            format_byte_size(recorded.device_line_bytes)
        );
    } else {
        log::info!(
            "cache {}: keeping ReCA's line size {} (configured {})",
            v.path.display(),
            format_byte_size(recorded.line_bytes),
            format_byte_size(configured)
        );
    }
    Ok(Some(line_size))
}

/// Reloads a running cache's category table (`ctl reca-reload`): `path`,
/// or the file in use (the built-in table if none).
pub fn reload(engine: &Engine, path: Option<&Path>) -> Result<Value> {
    let in_use = engine
        .reca_status()
        .ok_or_else(|| refused!("ReCA does not run on this cache"))?
        .table_source;
    let path = match path {
        Some(p) => Some(p.to_path_buf()),
        None if in_use == iocache_core::reca::BUILTIN_TABLE_SOURCE => None,
        None => Some(PathBuf::from(in_use)),
    };
    let (table, source) = read_table(path.as_deref())?;
    let status = engine.reca_reload(table, source)?;
    Ok(serde_json::to_value(crate::stats::RecaSnapshot::from(&status))?)
}
