//! Which connections a listener admits: per-family and per-peer places,
//! and which idle or slow connection makes room when they are full.

use super::*;

#[derive(Default)]
pub(super) struct Conns {
    pub(super) next_id: u64,
    /// Every live connection (until its thread ends).
    pub(super) entries: HashMap<u64, Entry>,
    pub(super) threads: Vec<JoinHandle<()>>,
}

/// Which listener a connection came from: each has its own connection
/// budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Family {
    Tcp,
    Unix,
}

/// A live connection, as the accept loop and the export table see it.
pub(super) struct Entry {
    /// A clone of the connection's stream, to stop its reads or close it.
    pub(super) stream: Stream,
    pub(super) family: Family,
    /// Who it comes from (see `peer.rs`), for the limits per peer.
    pub(super) peer: Peer,
    pub(super) accepted: Instant,
    /// The export, once in the transmission phase; `None` in the handshake.
    pub(super) export: Option<String>,
    pub(super) activity: Arc<Activity>,
    /// Closed to make room for another: no longer counted.
    pub(super) evicted: bool,
}

/// When a connection last did something, and what it has in flight.
#[derive(Default)]
pub(super) struct Activity {
    /// Requests read and not yet answered.
    pub(super) in_flight: AtomicUsize,
    /// Milliseconds since [`Shared::epoch`] of the last request read or
    /// answered (or of the start of transmission).
    pub(super) last_ms: AtomicU64,
}

impl Activity {
    pub(super) fn touch(&self, shared: &Shared) {
        self.last_ms.store(shared.now_ms(), Ordering::Relaxed);
    }
}

/// What [`Conns::make_room`] decided for a new connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Room {
    /// It may be served (a connection may have been closed for it).
    Made,
    /// Its listener is full and nothing could be closed.
    ListenerFull,
    /// Its peer holds all the places it may, none of which can be closed.
    PeerFull,
}

/// Which connections a new one may displace (see [`Conns::victim`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Victims {
    /// Handshakes only.
    Handshakes,
    /// Handshakes, then idle, then stalled transmission connections.
    Any,
}

impl Conns {
    /// The live (not evicted) connections of `family`'s listener.
    pub(super) fn live(&self, family: Family) -> impl Iterator<Item = (&u64, &Entry)> {
        self.entries
            .iter()
            .filter(move |(_, e)| e.family == family && !e.evicted)
    }

    /// Makes room for one more connection from `peer` on `family`'s
    /// listener if the budgets allow (see the module doc):
    ///
    /// 1. A peer at `max_handshakes_per_peer` loses its own oldest
    ///    handshake; a peer at `max_connections_per_peer` loses its own
    ///    oldest handshake, or idle or stalled connection, or the new
    ///    connection is refused ([`Room::PeerFull`]). A peer over its
    ///    limits never takes a place from another peer.
    /// 2. A listener at `max_handshakes` or `max_connections` closes the
    ///    oldest handshake of the peer holding the most places on it, then
    ///    the transmission connection idle longest (at least
    ///    `idle_eviction`), then the one stalled longest (at least
    ///    `stall_timeout`); else the new connection is refused
    ///    ([`Room::ListenerFull`]).
    pub(super) fn make_room(&mut self, family: Family, peer: Peer, shared: &Shared) -> Room {
        let config = &shared.config;
        let mine = |e: &Entry| e.peer == peer;
        let peer_total = self.live(family).filter(|(_, e)| mine(e)).count();
        let peer_handshakes = self
            .live(family)
            .filter(|(_, e)| mine(e) && e.export.is_none())
            .count();
        if peer_handshakes >= config.max_handshakes_per_peer || peer_total >= config.max_connections_per_peer
        {
            let which = if peer_handshakes >= config.max_handshakes_per_peer {
                Victims::Handshakes
            } else {
                Victims::Any
            };
            match self.victim(family, Some(peer), which, shared) {
                Some(id) => self.evict(id, shared),
                None => return Room::PeerFull,
            }
        }
        let handshaking = self.live(family).filter(|(_, e)| e.export.is_none()).count();
        let total = self.live(family).count();
        if handshaking < config.max_handshakes && total < config.max_connections {
            return Room::Made;
        }
        match self.victim(family, None, Victims::Any, shared) {
            // One out, one in: a listener over its handshake budget (after
            // a change of configuration, say) loses one per new connection.
            Some(id) => {
                self.evict(id, shared);
                Room::Made
            }
            None => Room::ListenerFull,
        }
    }

    /// The connection of `family`'s listener (of `only` if given) that a
    /// new one may displace: the oldest handshake of the peer holding the
    /// most places on the listener; else (with [`Victims::Any`]) the
    /// transmission connection with nothing in flight idle longest, if that
    /// is at least `idle_eviction`; else the one whose requests in flight
    /// have made no progress for longest, if that is at least
    /// `stall_timeout`.
    pub(super) fn victim(
        &self,
        family: Family,
        only: Option<Peer>,
        which: Victims,
        shared: &Shared,
    ) -> Option<u64> {
        let config = &shared.config;
        let candidates = || {
            self.live(family)
                .filter(move |(_, e)| only.is_none_or(|p| e.peer == p))
        };
        let mut places: HashMap<Peer, usize> = HashMap::new();
        for (_, e) in self.live(family) {
            *places.entry(e.peer).or_default() += 1;
        }
        // Fairness: the biggest peer's handshake goes first, so a peer
        // holding few places is not the one a flood from another peer
        // keeps evicting; among equals, the oldest handshake.
        let handshake = candidates()
            .filter(|(_, e)| e.export.is_none())
            .max_by_key(|(_, e)| {
                (
                    places.get(&e.peer).copied().unwrap_or(0),
                    std::cmp::Reverse(e.accepted),
                )
            })
            .map(|(id, _)| *id);
        if handshake.is_some() || which == Victims::Handshakes {
            return handshake;
        }
        let now = shared.now_ms();
        let quiet_ms = |e: &Entry| now.saturating_sub(e.activity.last_ms.load(Ordering::SeqCst));
        let idle = config.idle_eviction.and_then(|min_idle| {
            candidates()
                .filter(|(_, e)| e.export.is_some() && e.activity.in_flight.load(Ordering::SeqCst) == 0)
                .map(|(id, e)| (*id, quiet_ms(e)))
                .filter(|(_, idle)| *idle >= min_idle.as_millis() as u64)
                .max_by_key(|(_, idle)| *idle)
                .map(|(id, _)| id)
        });
        idle.or_else(|| {
            // A connection with requests in flight that has neither read
            // a request nor finished a reply for `stall_timeout` (a client
            // that stopped reading its replies): closing it loses nothing
            // its client was told was done.
            candidates()
                .filter(|(_, e)| e.export.is_some() && e.activity.in_flight.load(Ordering::SeqCst) > 0)
                .map(|(id, e)| (*id, quiet_ms(e)))
                .filter(|(_, quiet)| *quiet >= config.stall_timeout.as_millis() as u64)
                .max_by_key(|(_, quiet)| *quiet)
                .map(|(id, _)| id)
        })
    }

    /// Closes connection `id` to make room for another; it no longer counts.
    pub(super) fn evict(&mut self, id: u64, shared: &Shared) {
        if let Some(entry) = self.entries.get_mut(&id) {
            entry.evicted = true;
            let _ = entry.stream.shutdown(Shutdown::Both);
            shared.stats.evicted_connections.fetch_add(1, Ordering::Relaxed);
        }
    }
}
