//! The serving layer's one error type. Errors name the key of the
//! configuration (as its `Origin` names keys) or the request field they
//! concern; where the way out is an acknowledgement the operator gives,
//! they say which, and the caller words it.

/// What the operator may acknowledge to get past a refusal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Acknowledgement {
    /// The engine's own: format losing data, accept damage, rebind.
    Engine(iocache_engine::Acknowledgement),
    /// Begin with an empty cache in front of backends that existed before.
    Init,
    /// Run a configuration that loses data at a crash.
    Force,
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// What was asked cannot be served as given; the message names the key
    /// or the request field.
    #[error("{0}")]
    Refused(String),
    /// Refused until acknowledged (see [`ServeError::acknowledgement`]).
    #[error("{message}")]
    NeedsAcknowledgement {
        message: String,
        acknowledgement: Acknowledgement,
    },
    #[error(transparent)]
    Engine(#[from] iocache_engine::EngineError),
    #[error(transparent)]
    Device(#[from] iocache_device::DeviceError),
    #[error(transparent)]
    Server(#[from] iocache_nbd::ServerError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Array(#[from] iocache_engine::ArrayError),
    #[error(transparent)]
    Listen(#[from] iocache_nbd::ListenError),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// A failure in a named step or about a named key.
    #[error("{context}")]
    Within {
        context: String,
        #[source]
        source: Box<ServeError>,
    },
}

impl ServeError {
    /// The acknowledgement that would get past this refusal, if any.
    pub fn acknowledgement(&self) -> Option<Acknowledgement> {
        match self {
            ServeError::NeedsAcknowledgement { acknowledgement, .. } => Some(*acknowledgement),
            ServeError::Engine(e) => e.acknowledgement().map(Acknowledgement::Engine),
            ServeError::Within { source, .. } => source.acknowledgement(),
            _ => None,
        }
    }
}

/// An error and its causes, each said once: `context: cause: cause`. A
/// library error whose message already includes its source's (thiserror's
/// `"{0}"` with `#[source]`) would otherwise print that source twice, so a
/// cause whose text the message so far already contains is left out.
pub fn error_chain_text(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = String::new();
    for cause in std::iter::successors(Some(error), |e| e.source()) {
        let part = cause.to_string();
        if part.is_empty() || text.contains(&part) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&part);
    }
    text
}

pub type Result<T, E = ServeError> = std::result::Result<T, E>;

/// `ServeError::Refused` from a format string.
macro_rules! refused {
    ($($arg:tt)*) => {
        $crate::error::ServeError::Refused(format!($($arg)*))
    };
}
pub(crate) use refused;

/// Names the step or key an error happened in.
pub(crate) trait Within<T> {
    fn within(self, context: impl FnOnce() -> String) -> Result<T>;
}

impl<T, E: Into<ServeError>> Within<T> for std::result::Result<T, E> {
    fn within(self, context: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| ServeError::Within {
            context: context(),
            source: Box::new(e.into()),
        })
    }
}
