//! Why this module exists: ReCA (Salkhordeh, Ebrahimi & Asadi, "ReCA: An
//! Efficient Reconfigurable Cache Architecture for Storage Systems with
//! Online Workload Characterization", IEEE TPDS 2018) recognises the
//! workload a cache serves and reconfigures the cache for it while it runs.
//! Its parts, all sans-I/O:
//!
//! - `classify.rs`: the request classifier (§3.1, Algorithm 2);
//! - `table.rs`: the workload categories and their cache configurations as
//!   data (§3.3), and the choice by Euclidean distance;
//! - `policy.rs`: the priority-based admission and eviction of Algorithm 1,
//!   as the `reca` replacement policy;
//! - `controller.rs`: per-window workload vectors, category changes and
//!   what they change in a cache (through `Cache::set_controller_policy`
//!   and `Cache::apply`), each change an event;
//! - `relayout.rs`: a new cache with another line size holding every
//!   sector of the old one (the driver swaps them).

pub mod classify;
pub mod controller;
pub mod policy;
pub mod relayout;
pub mod table;

pub use classify::{AccessClass, Classified, Classifier, ClassifierParams, RequestClass};
pub use controller::{RecaController, RecaControllerParams, RecaEvent, WindowReport};
pub use policy::{RecaParams, RecaPolicy};
pub use relayout::{relayout, Relayout};
pub use table::{
    Category, CategoryTable, EvictionRule, Features, Priorities, TableError, BUILTIN_TABLE_SOURCE,
    FEATURE_NAMES,
};
