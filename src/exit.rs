//! Exit statuses, so that a supervisor can tell a start worth repeating
//! from one that fails the same way every time (docs/ops.md, "Exit
//! statuses").

use iocache_engine::EngineError;
use iocache_serving::ServeError;

/// A usage or configuration error, or a refusal an operator must answer:
/// the same start fails the same way.
pub const USAGE: i32 = 2;
/// Something that may pass (a backend or a port not reachable yet, a
/// device another process still holds): worth a restart. sysexits' EX_TEMPFAIL.
pub const TRANSIENT: i32 = 75;

/// Marks an error as one of [`USAGE`] (its text adds nothing).
#[derive(Debug)]
struct Usage;

impl std::fmt::Display for Usage {
    fn fmt(&self, _: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        Ok(())
    }
}

/// `e`, marked as a usage or configuration error.
pub fn usage(e: anyhow::Error) -> anyhow::Error {
    e.context(Usage)
}

/// A serving error as the binary reports it: refusals are marked as usage
/// errors.
pub fn classified(e: ServeError) -> anyhow::Error {
    let refusal = refuses(&e);
    let e = anyhow::Error::new(e);
    if refusal {
        usage(e)
    } else {
        e
    }
}

fn refuses(e: &ServeError) -> bool {
    match e {
        ServeError::Refused(_) | ServeError::NeedsAcknowledgement { .. } => true,
        ServeError::Engine(e) => matches!(
            e,
            EngineError::Refused(_)
                | EngineError::Unacknowledged { .. }
                | EngineError::DamagedMetadata(_)
                | EngineError::BackendMismatch(_)
                | EngineError::Config(_)
                | EngineError::CacheDeviceTooSmall { .. }
        ),
        ServeError::Within { source, .. } => refuses(source),
        _ => false,
    }
}

/// The exit status for a command that failed with `e`: [`USAGE`], then
/// [`TRANSIENT`] when a cause is a connection or a lock that may come
/// free, else 1.
pub fn status_of(e: &anyhow::Error) -> i32 {
    if e.downcast_ref::<Usage>().is_some() {
        return USAGE;
    }
    let transient = e.chain().any(|cause| {
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind::*;
            return matches!(
                io.kind(),
                ConnectionRefused
                    | ConnectionReset
                    | ConnectionAborted
                    | NotConnected
                    | TimedOut
                    | WouldBlock
                    | AddrInUse
                    | AddrNotAvailable
                    | HostUnreachable
                    | NetworkUnreachable
            );
        }
        matches!(
            cause.downcast_ref::<iocache_device::DeviceError>(),
            Some(iocache_device::DeviceError::Busy { .. })
        )
    });
    if transient {
        TRANSIENT
    } else {
        1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_tell_usage_from_transient_from_the_rest() {
        assert_eq!(status_of(&usage(anyhow::anyhow!("bad key"))), USAGE);
        assert_eq!(status_of(&classified(ServeError::Refused("no".into()))), USAGE);
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(
            status_of(&anyhow::Error::new(refused).context("backend")),
            TRANSIENT
        );
        assert_eq!(status_of(&anyhow::anyhow!("disk full")), 1);
        // The marker adds no text.
        let text = iocache_serving::error_chain_text(usage(anyhow::anyhow!("bad key")).as_ref());
        assert_eq!(text, "bad key");
    }
}
