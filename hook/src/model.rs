//! The values the start work is made of (`engine.model`'s `Symlink` and
//! `LdCacheEntry`, `engine.start.work.StartWork`), as the hook holds them once
//! the container's devices have chosen them (`work`).

/// A link to create in the container at start: `path` -> `target`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Symlink {
    pub path: String,
    pub target: String,
}

/// One entry of glibc's ld.so.cache: `libcuda.so.1 (libc6,x86-64) => /usr/lib/.../libcuda.so.1`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LdCacheEntry {
    /// The key, normally the SONAME: `libcuda.so.1`.
    pub name: String,
    /// As written in the cache (relative to the root ldconfig ran for).
    pub path: String,
    /// glibc's raw flags word.
    pub flags: i32,
    /// x86-64 (or another 64-bit ABI) vs 32-bit.
    pub is_64bit: bool,
    pub hwcap: u64,
    /// The minimum kernel from the library's ABI note, 0 if none.
    pub osversion: u32,
}

/// `engine.ld_cache`: how a GPU container's ld.so.cache gets the driver libraries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LdCacheMode {
    #[default]
    Merge,
    Rebuild,
}

/// What a daemon's IPC endpoint must be on the host (`engine.model.EntryType`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EntryKind {
    #[default]
    Socket,
    Directory,
}

/// An IPC endpoint the container got: the catalogue path (the same in the
/// container as under the driver root) and what it must be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IpcEndpoint {
    pub path: String,
    pub kind: EntryKind,
}

/// Everything the start work needs, as plain values (`engine.start.work.StartWork`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StartWork {
    /// For messages: `container <id>`.
    pub container: String,
    /// What stays under `/proc/driver/nvidia/gpus`, sorted.
    pub visible_bus_ids: Vec<String>,
    pub symlinks: Vec<Symlink>,
    pub ldconfig_folders: Vec<String>,
    /// `None` on a real node (the container's own `/proc/driver/nvidia` is the
    /// view's source); a host directory (a simulated node's
    /// `<proc_root>/driver/nvidia`) when the container's procfs has no driver.
    pub proc_source: Option<String>,
    /// Inserted into the image's cache.
    pub ld_cache_entries: Vec<LdCacheEntry>,
    /// Merge (the default: no process runs) or rebuild with the trusted `ldconfig`.
    pub ld_cache: LdCacheMode,
    pub ldconfig: String,
    /// The IPC endpoints the container got, and the driver root they are under on the host.
    pub ipc: Vec<IpcEndpoint>,
    pub ipc_root: String,
    /// MIG: the capability files the view shows, relative to
    /// `/proc/driver/nvidia/capabilities/`, sorted; `proc_caps_all`: the whole
    /// folder, live, instead (a MIG config grant).
    pub proc_caps: Vec<String>,
    pub proc_caps_all: bool,
    /// CUDA forward compatibility (`policy.cuda_compat`), against the host's driver version.
    pub cuda_compat: bool,
    pub driver_version: String,
    /// Graphics on some GPUs: the application profile's text, "" writes nothing.
    pub app_profile: String,
}
