//! Opening what a server serves, the same way at start (`start.rs`) and for
//! `ctl attach` while it runs (`running.rs`): backend files and remote NBD
//! exports, cache device files, the files some volume already claims, and
//! the server's [`Scope`] (where it listens, which paths it may open how).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{refused, Result, ServeError, Within};
use crate::NbdBackend;
use iocache_core::units::format_byte_size;
use iocache_device::{BlockDevice, FileDevice, OpenOptions};

use crate::config::normalize;

/// A file some volume opened: canonical path, volume (export) and role.
pub type Claim = (PathBuf, String, &'static str);

/// Where this server listens and which paths it may open how.
pub struct Scope {
    /// The Unix socket, symbolic links resolved.
    pub socket: Option<PathBuf>,
    /// The bound TCP address.
    pub tcp: Option<std::net::SocketAddr>,
    /// The default data directory, if used: files in it are opened
    /// without following symbolic links.
    pub private_dir: Option<PathBuf>,
    /// Directories (absolute; resolved when used) under which `attach` may
    /// open backend files.
    pub attach_dirs: Vec<PathBuf>,
}

impl Scope {
    /// Whether a file at `path` is opened without following a symbolic
    /// link in its last component.
    pub fn no_follow(&self, path: &Path) -> bool {
        self.private_dir.as_ref().is_some_and(|d| path.starts_with(d))
    }

    /// Where attach opens a backend file: the directory of `attach_dirs`
    /// it lies under (lexically, `..` folded) and its path below it. The
    /// file is then opened beneath that directory (`OpenOptions::beneath`),
    /// following no symbolic link, so what is opened is what was checked.
    pub fn attach_location(&self, path: &Path) -> Result<(PathBuf, PathBuf)> {
        if self.attach_dirs.is_empty() {
            return Err(refused!(
                "backend: this server attaches no backend files, only NBD exports (it was started \
                 without a directory to attach files from)"
            ));
        }
        let absolute = normalize(&std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf()));
        for dir in &self.attach_dirs {
            let lexical = normalize(&std::path::absolute(dir).unwrap_or_else(|_| dir.clone()));
            let resolved = std::fs::canonicalize(dir).ok();
            for base in std::iter::once(lexical).chain(resolved) {
                if let Ok(below) = absolute.strip_prefix(&base) {
                    if below.as_os_str().is_empty() {
                        return Err(refused!(
                            "backend: {} is the attach directory itself, not a file in it",
                            path.display()
                        ));
                    }
                    return Ok((base, below.to_path_buf()));
                }
            }
        }
        Err(refused!(
            "backend: {} is not under a directory this server attaches files from ({})",
            absolute.display(),
            self.attach_dirs
                .iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ))
    }

    /// Whether the NBD URI `uri` reaches this server.
    fn is_own(&self, uri: &str) -> bool {
        let Ok(parsed) = iocache_nbd::parse_nbd_uri(uri) else {
            return false;
        };
        match parsed.addr {
            iocache_nbd::NbdAddr::Unix { socket } => self.socket.as_ref() == Some(&canonical_path(&socket)),
            iocache_nbd::NbdAddr::Tcp { host, port } => {
                let Some(own) = self.tcp else {
                    return false;
                };
                if port != own.port() {
                    return false;
                }
                use std::net::ToSocketAddrs;
                let Ok(addrs) = (host.as_str(), port).to_socket_addrs() else {
                    return false;
                };
                // Listening on a wildcard address takes the port on every
                // local address; otherwise only the address itself is ours.
                addrs.into_iter().any(|a| {
                    a.ip() == own.ip()
                        || own.ip().is_unspecified()
                            && (a.ip().is_loopback() || a.ip().is_unspecified() || is_local_address(a.ip()))
                })
            }
        }
    }
}

/// Whether `ip` is one of this machine's addresses (it can be bound).
fn is_local_address(ip: std::net::IpAddr) -> bool {
    std::net::TcpListener::bind((ip, 0)).is_ok()
}

/// The path with symbolic links resolved; for a file not created yet, its
/// directory's resolved path and its name, or the absolute path.
pub fn canonical_path(path: &Path) -> PathBuf {
    if let Ok(p) = std::fs::canonicalize(path) {
        return p;
    }
    if let (Some(dir), Some(name)) = (path.parent(), path.file_name()) {
        let dir = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        if let Ok(d) = std::fs::canonicalize(dir) {
            return d.join(name);
        }
    }
    normalize(&std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf()))
}

/// Refuses a file some volume of this server already opens (under any
/// name), naming that volume and its role. Checked before a file is
/// opened: its exclusive open would only say "in use by this process".
pub fn check_claim(files: &[Claim], path: &Path, role: &'static str, key: &str) -> Result<()> {
    let canonical = canonical_path(path);
    if let Some((_, other, other_role)) = files.iter().find(|(p, _, _)| *p == canonical) {
        let hint = if role == "cache" && *other_role == "cache" {
            " (volumes share a cache device when they name it with the same path)"
        } else {
            ""
        };
        return Err(refused!(
            "{key}: {} is the same file as volume `{other}`'s {other_role}{hint}",
            path.display()
        ));
    }
    Ok(())
}

/// Records that `export` opened `path` as `role` (once the file exists).
pub fn record_claim(files: &mut Vec<Claim>, path: &Path, export: &str, role: &'static str) -> PathBuf {
    let canonical = canonical_path(path);
    files.push((canonical.clone(), export.to_string(), role));
    canonical
}

/// Which backend to open, for which volume, and how to name its keys.
pub struct BackendSpec<'a> {
    /// A path, or an `nbd://` / `nbd+unix://` URI.
    pub backend: &'a str,
    /// Create a missing file of this size.
    pub create_bytes: Option<u64>,
    pub export: &'a str,
    /// How the backend and its size are named in errors.
    pub key: &'a str,
    pub size_key: &'a str,
    /// Open the file beneath this directory, at this path below it.
    pub beneath: Option<&'a (PathBuf, PathBuf)>,
}

/// Opens a volume's backend: a file (created with `create_bytes` if
/// missing and given) or a remote NBD export. Also says whether this call
/// created the file (a new, empty volume).
pub fn open_backend(
    spec: &BackendSpec<'_>,
    files: &mut Vec<Claim>,
    own: &Scope,
) -> Result<(Arc<dyn BlockDevice>, bool)> {
    let BackendSpec {
        backend,
        create_bytes,
        export,
        key,
        size_key,
        beneath,
    } = *spec;
    if backend.starts_with("nbd://") || backend.starts_with("nbd+unix://") {
        if own.is_own(backend) {
            return Err(refused!(
                "{key}: {backend} is this server's own export: a volume cannot be its own backend \
                 (every FLUSH and the shutdown would wait for themselves)"
            ));
        }
        let remote = NbdBackend::connect(backend).within(|| key.to_string())?;
        return Ok((Arc::new(remote), false));
    }
    let path = Path::new(backend);
    // Device nodes live under /dev (its RAM disk /dev/shm holds files).
    if !path.exists() && path.starts_with("/dev") && !path.starts_with("/dev/shm") {
        return Err(refused!(
            "{key}: {} does not exist: a device is not created (check its name)",
            path.display()
        ));
    }
    if !path.exists() && create_bytes.is_none() {
        return Err(refused!(
            "{key}: {} does not exist; to create a new backend file there, give its size with {size_key} \
             (a mistyped path would otherwise become an empty disk)",
            path.display()
        ));
    }
    check_claim(files, path, "backend", key)?;
    let created = !path.exists();
    let device = match beneath {
        None => open_file(path, create_bytes.unwrap_or(0), false, own.no_follow(path)),
        Some((dir, below)) => FileDevice::open(
            below,
            OpenOptions {
                create_size: create_bytes,
                exclusive: true,
                beneath: Some(dir.clone()),
                ..OpenOptions::default()
            },
        )
        .map_err(|e| {
            let errno = match &e {
                iocache_device::DeviceError::Open { source, .. } => source.raw_os_error(),
                _ => None,
            };
            match errno {
                Some(libc::ELOOP) => refused!(
                    "{} is, or passes through, a symbolic link below {}: links are not followed there",
                    path.display(),
                    dir.display()
                ),
                Some(libc::EXDEV) => refused!("{} leaves {}", path.display(), dir.display()),
                _ => ServeError::Within {
                    context: format!("opening {} beneath {}", below.display(), dir.display()),
                    source: Box::new(e.into()),
                },
            }
        }),
    }
    .within(|| key.to_string())?;
    if let Some(asked) = create_bytes.filter(|&asked| !created && asked != device.len_bytes()) {
        log::warn!(
            "{key}: {} exists and holds {}; {size_key} {} sizes only a file it creates, so the file is \
             used as it is",
            path.display(),
            format_byte_size(device.len_bytes()),
            format_byte_size(asked)
        );
    }
    record_claim(files, device.path(), export, "backend");
    Ok((Arc::new(device), created))
}

/// Creates the directory a socket at `path` will be in when it is missing
/// but its own parent exists; refuses a path deeper in directories that do
/// not exist (a mistyped path would otherwise create them).
pub fn create_socket_dir(path: &Path) -> Result<()> {
    let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) else {
        return Ok(());
    };
    if dir.exists() {
        return Ok(());
    }
    match dir.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(grandparent) if !grandparent.exists() => Err(refused!(
            "{}: the directory {} does not exist, nor {}; give a path in an existing directory",
            path.display(),
            dir.display(),
            grandparent.display()
        )),
        _ => create_parent(path),
    }
}

/// Creates the directory `path` will be in, if missing.
pub fn create_parent(path: &Path) -> Result<()> {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => {
            std::fs::create_dir_all(dir).within(|| format!("creating {}", dir.display()))
        }
        _ => Ok(()),
    }
}

/// [`open_file`] for a cache device: one in memory (tmpfs such as
/// `/dev/shm`, ramfs) is then mapped, its whole size allocated
/// (`FileDevice::map_if_in_memory`); if that fails (no room for it), it
/// is used through `pread`/`pwrite` as before, with a warning. Not with
/// `map` false (`--no-map-cache`).
pub fn open_cache_file(
    path: &Path,
    create_bytes: u64,
    direct: bool,
    no_follow: bool,
    map: bool,
) -> Result<FileDevice> {
    let mut device = open_file(path, create_bytes, direct, no_follow)?;
    if !map {
        return Ok(device);
    }
    match device.map_if_in_memory() {
        Ok(true) => log::info!(
            "{} is in memory: mapped, its {} allocated",
            path.display(),
            format_byte_size(device.len_bytes())
        ),
        Ok(false) => {}
        Err(e) => log::warn!("{}: not mapped ({e}); using pread and pwrite", path.display()),
    }
    Ok(device)
}

/// Opens (creating a sparse file of `create_bytes` if missing, and its
/// directory) a file device.
pub fn open_file(path: &Path, create_bytes: u64, direct: bool, no_follow: bool) -> Result<FileDevice> {
    let exists = path.exists();
    if !exists {
        create_parent(path)?;
    }
    if no_follow && std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) {
        return Err(refused!(
            "{} is a symbolic link in the data directory: not following it (someone may have \
             planted it); remove it, or name the file you mean with its own flag",
            path.display()
        ));
    }
    let device = FileDevice::open(
        path,
        OpenOptions {
            direct,
            create_size: (!exists).then_some(create_bytes),
            read_only: false,
            exclusive: true,
            no_follow,
            beneath: None,
        },
    )
    .within(|| format!("opening {}", path.display()))?;
    if !exists {
        log::info!("created {} ({})", path.display(), format_byte_size(create_bytes));
    }
    Ok(device)
}
