//! Whose data a volume's lines are: the backend identities recorded in
//! the volume table, and how they are described in messages.

use super::*;

/// The identity recorded for `backend` (`None` when it cannot say).
pub fn backend_identity(backend: &dyn BlockDevice) -> Option<VolumeIdentity> {
    backend
        .identity()
        .map(|id| VolumeIdentity::of(id.kind.code(), &id.key))
}

/// An identity for messages: its kind and digest.
pub fn describe_identity(identity: Option<VolumeIdentity>) -> String {
    match identity {
        None => "no identity".to_string(),
        Some(id) => match IdentityKind::from_code(id.kind) {
            Some(kind) => format!("{} {:016x}", kind.name(), id.digest),
            None => format!("identity of unknown kind {} {:016x}", id.kind, id.digest),
        },
    }
}

/// A backend's identity in full, for messages and logs.
pub fn describe_backend(backend: &dyn BlockDevice) -> String {
    match backend.identity() {
        None => "no identity".to_string(),
        Some(id) => format!(
            "{} {:016x}: {}{}",
            id.kind.name(),
            VolumeIdentity::of(id.kind.code(), &id.key).digest,
            id.key,
            if id.weak {
                ", which may change at a reboot"
            } else {
                ""
            }
        ),
    }
}

/// Two configured volumes must not share a backend: each would cache it
/// apart from the other.
pub(super) fn check_distinct_backends(
    spec: &OpenSpec,
    backends: &[&dyn BlockDevice],
) -> Result<(), EngineError> {
    let identities: Vec<Option<VolumeIdentity>> = backends.iter().map(|b| backend_identity(*b)).collect();
    for (i, a) in identities.iter().enumerate() {
        let Some(a) = a else { continue };
        if let Some(j) = identities[..i].iter().position(|b| b.as_ref() == Some(a)) {
            return Err(EngineError::Config(format!(
                "volumes `{}` and `{}` have the same backend ({}): each would cache it without the other",
                spec.volumes[j].0,
                spec.volumes[i].0,
                describe_backend(backends[i])
            )));
        }
    }
    Ok(())
}
