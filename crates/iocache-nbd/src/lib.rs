//! NBD (Network Block Device) for iocache: the wire protocol, a server and a
//! client.
//!
//! The cache will be served to its clients over NBD, and a remote NBD export
//! can be one of its backends, so both ends of the protocol live here:
//!
//! - [`proto`]: every constant of the protocol and sans-I/O encoders and
//!   parsers for the handshake, options, requests and replies (simple and
//!   structured).
//! - [`handshake`]: the server side of fixed newstyle option negotiation,
//!   generic over any byte stream so it can be tested without sockets.
//! - [`export`]: the [`Export`] trait the cache implements, its errors and
//!   their NBD error numbers, and [`MemExport`], a RAM-backed export.
//! - [`server`]: [`Server`], listening on a Unix socket and/or TCP, one thread
//!   per connection plus a small worker pool that answers pipelined requests
//!   out of order.
//! - [`client`]: [`Client`], a minimal blocking client, and
//!   [`parse_nbd_uri`] for `nbd://` and `nbd+unix://` URIs.
//!
//! `fuzzing` (hidden from the documentation) holds the bodies of the fuzz
//! targets in `fuzz/` and of the property tests built on the same inputs.
//!
//! It depends on nothing but `std` and `thiserror`: no async runtime; the
//! server uses threads and bounded queues.
//!
//! ```
//! use std::sync::Arc;
//! use iocache_nbd::{Client, ConnectOptions, MemExport, Server, ServerConfig};
//!
//! let config = ServerConfig { tcp: Some("127.0.0.1:0".parse().unwrap()), ..ServerConfig::default() };
//! let mut server = Server::new(config);
//! server.add_export("disk", Arc::new(MemExport::new(1 << 20))).unwrap();
//! let running = server.start().unwrap();
//!
//! let uri = format!("nbd://{}/disk", running.tcp_addr().unwrap());
//! let mut client = Client::connect(&uri).unwrap();
//! client.write(4096, &[7u8; 512], false).unwrap();
//! let mut back = [0u8; 512];
//! client.read(4096, &mut back).unwrap();
//! assert_eq!(back, [7u8; 512]);
//! client.disconnect().unwrap();
//! running.shutdown();
//! ```

pub mod client;
pub mod export;
#[doc(hidden)]
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
pub mod handshake;
mod kept;
pub mod listen;
pub mod peer;
pub mod proto;
mod request_reader;
pub mod server;
pub mod tls;

pub use client::{
    list_exports, parse_nbd_uri, Client, ClientError, ConnectOptions, NbdAddr, NbdUri, UriError,
};
pub use export::{Export, ExportError, ExportLookup, Exports, InPlace, MemExport};
pub use handshake::{HandshakeError, Negotiated, NegotiationLimits};
pub use listen::{bind_unix_socket, BoundUnixSocket, ListenError, SocketFileRemover};
pub use peer::Peer;
pub use proto::{CmdFlags, Command, ProtoError, Request, RequestHeader};
pub use server::{
    ConnectionStream, ExportHandle, RunningServer, Server, ServerConfig, ServerError, ServerStats,
    ShutdownHandle, POLL_BEFORE_SLEEP_MAX,
};
pub use tls::{load_psk_file, parse_psk_file, PskKeys, TlsCredentials, TlsError, TlsMode, TlsServer};
