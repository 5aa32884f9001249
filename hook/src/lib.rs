//! nri-gpu's CDI `createContainer` hook, compiled: the container-start work of
//! the CDI path (podman, Docker, any runtime that reads CDI specs), as
//! `engine/start` does it for the NRI path.
//!
//! Why compiled: the runtime runs the hook at every GPU container's start and
//! waits for it; a Python interpreter's start and imports alone cost more than a
//! GPU container's whole budget (docs/performance.md, "The CDI path"). The
//! Python engine stays the reference: this crate ports its start work step by
//! step, with the same bounds and messages, and the tests hold the two to the
//! same results.

pub mod appprofile;
pub mod bytes;
pub mod cli;
pub mod compat;
pub mod cudacompat;
pub mod elf;
pub mod error;
pub mod ipc;
pub mod json;
pub mod ldcache;
pub mod ldconf;
pub mod ldrebuild;
pub mod links;
pub mod model;
pub mod procsource;
pub mod procview;
pub mod rootdir;
pub mod start;
pub mod sys;
pub mod work;

#[cfg(test)]
mod testroot;
