//! The hook's work: what the CDI spec describes, and what a container's devices
//! choose from it.  (pure)
//!
//! `nri-gpu cdi generate` plans once, in Python, and writes the result into the
//! spec's hook as one JSON argument (`engine.cdi.hook_work`): the spec-wide part
//! of the start work (links, ld.so.conf folders, ld.so.cache entries, the IPC
//! endpoints the spec's mounts may bind, the procfs source, CUDA compatibility)
//! and the node's devices as the spec names them (each GPU's minor and bus id,
//! the MIG instances' capability minors). The hook plans nothing: the GPUs a
//! container got are the character devices the runtime put into the bundle's
//! `linux.devices` (a CDI hook cannot be per device: two devices would run it
//! twice), and this module turns them into the container's `StartWork` exactly
//! as `engine.hook.gpu_request` and `engine.plan.plan` do for the Python hook:
//!
//! * a MIG device: its parent's `/dev/nvidia<M>` with both its GPU instance's and
//!   its compute instance's `nvidia-caps` nodes; its parent's bus id stays visible
//!   and the view shows its two access files;
//! * a whole GPU: its `/dev/nvidia<M>`, unless it is there only as the parent of
//!   MIG devices (a node is a node: the two cannot be told apart, and a whole
//!   GPU in MIG mode gives CUDA nothing anyway);
//! * `mig/monitor`'s and `mig/config`'s nodes: the monitor and config grants
//!   (config shows the whole `capabilities/` folder, live, and every instance of
//!   the container's GPUs);
//! * graphics with some of the node's whole GPUs but not all: the
//!   `EGLVisibleDGPUDevices` application profile of their minors.
//!
//! The spec and its hook come from one plan at one time, so a driver change
//! needs a new spec either way (its mounts name the driver's files); runc then
//! fails to bind a file that is gone before the hook runs.

use std::collections::{BTreeMap, BTreeSet};

use crate::error::{cut, py_repr};
use crate::json::Value;
use crate::model::{EntryKind, IpcEndpoint, LdCacheEntry, LdCacheMode, StartWork, Symlink};
use crate::procsource::is_bus_id;
use crate::rootdir::is_clean_absolute;

/// The description's format; a spec written by another version is refused by name.
pub const VERSION: i64 = 1;
/// The driver documents EGLVisibleDGPUDevices as a 32-bit mask.
pub const MAX_PROFILE_MINOR: i64 = 31;
// Bounds far above any node (8 GPUs, 7 MIG instances each, ~60 libraries), so a
// description cannot make the hook work long.
const MAX_ITEMS: usize = 4096;
const MAX_STRING: usize = 4096;

/// A description (or a bundle) that cannot be used; the message names the value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadInput(pub String);

type Result<T> = std::result::Result<T, BadInput>;

fn bad<T, S: Into<String>>(message: S) -> Result<T> {
    Err(BadInput(message.into()))
}

/// A catalogue IPC endpoint the spec may bind: the bundle's mount at `path` from
/// `source` (the host path runc binds) is one the container got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IpcCandidate {
    pub endpoint: IpcEndpoint,
    pub source: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuDevice {
    pub minor: i64,
    pub bus_id: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ComputeInstance {
    pub ci: i64,
    pub minor: i64,
}

/// `capabilities/gpu<gpu>/mig/gi<gi>`: one GPU instance, its access file's minor,
/// and its compute instances.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuInstance {
    pub gpu: i64,
    pub gi: i64,
    pub minor: i64,
    pub compute_instances: Vec<ComputeInstance>,
}

/// What the spec's hook argument holds.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Description {
    pub symlinks: Vec<Symlink>,
    pub ldconfig_folders: Vec<String>,
    pub ld_cache_entries: Vec<LdCacheEntry>,
    /// `engine.ld_cache`: merge into the image's cache, or rebuild it with `ldconfig`.
    pub ld_cache: LdCacheMode,
    /// The trusted (static, root's) ldconfig that rebuilds the cache.
    pub ldconfig: String,
    pub proc_source: Option<String>,
    pub ipc_root: String,
    pub ipc: Vec<IpcCandidate>,
    pub cuda_compat: bool,
    pub driver_version: String,
    /// The spec's capabilities include graphics or display (the profile applies).
    pub graphics: bool,
    pub nvidia_major: Option<i64>,
    pub caps_major: Option<i64>,
    /// Every GPU of the node, by index.
    pub gpus: Vec<GpuDevice>,
    pub gpu_instances: Vec<GpuInstance>,
    pub monitor_minor: Option<i64>,
    pub config_minor: Option<i64>,
}

/// What the hook reads of the bundle's `config.json`.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Bundle {
    /// `root.path`, as written (relative to the bundle unless absolute).
    pub root_path: String,
    /// (major, minor) of the character devices in `linux.devices`.
    pub char_devices: Vec<(i64, i64)>,
    /// (source, destination) of `mounts`.
    pub mounts: Vec<(String, String)>,
}

// ------------------------------------------------------------------ reading

fn field<'a>(object: &'a Value, key: &str, what: &str) -> Result<&'a Value> {
    match object.get(key) {
        Some(value) => Ok(value),
        None => bad(format!("{} has no {}", what, key)),
    }
}

fn string(value: &Value, what: &str) -> Result<String> {
    match value.as_str() {
        Some(text) if text.len() <= MAX_STRING && !text.contains('\0') => Ok(text.to_string()),
        Some(text) => bad(format!("{}: {} is too long or holds a NUL", what, py_repr(cut(text, 100)))),
        None => bad(format!("{} is not a string", what)),
    }
}

fn path(value: &Value, what: &str) -> Result<String> {
    let text = string(value, what)?;
    if !is_clean_absolute(&text) {
        return bad(format!("{}: {} is not a clean absolute path", what, py_repr(cut(&text, 200))));
    }
    Ok(text)
}

fn integer(value: &Value, what: &str, low: i64, high: i64) -> Result<i64> {
    match value.as_i64() {
        Some(n) if (low..=high).contains(&n) => Ok(n),
        _ => bad(format!("{} is not an integer from {} to {}", what, low, high)),
    }
}

fn optional_integer(value: &Value, what: &str, low: i64, high: i64) -> Result<Option<i64>> {
    match value {
        Value::Null => Ok(None),
        other => integer(other, what, low, high).map(Some),
    }
}

fn boolean(value: &Value, what: &str) -> Result<bool> {
    match value.as_bool() {
        Some(b) => Ok(b),
        None => bad(format!("{} is not true or false", what)),
    }
}

fn list<'a>(value: &'a Value, what: &str) -> Result<&'a [Value]> {
    match value.as_array() {
        Some(items) if items.len() <= MAX_ITEMS => Ok(items),
        Some(items) => bad(format!("{}: {} items, over the limit of {}", what, items.len(), MAX_ITEMS)),
        None => bad(format!("{} is not a list", what)),
    }
}

/// A list of exactly `n` values (a tuple in the description).
fn tuple<'a>(value: &'a Value, n: usize, what: &str) -> Result<&'a [Value]> {
    match value.as_array() {
        Some(items) if items.len() == n => Ok(items),
        _ => bad(format!("{} is not a list of {} values", what, n)),
    }
}

const MAX_DEVICE_NUMBER: i64 = (1 << 20) - 1; // a minor has 20 bits, a major 12

/// The description, checked: every path clean and absolute, every number in range,
/// every bus id one path component (as `StartWork.__post_init__` checks them).
pub fn read_description(value: &Value) -> Result<Description> {
    let top = "the work description";
    if value.as_object().is_none() {
        return bad(format!("{} is not a JSON object", top));
    }
    let version = field(value, "version", top)?;
    if version.as_i64() != Some(VERSION) {
        return bad(format!(
            "{} is of version {}, this hook reads version {}: write the spec again with this nri-gpu (`nri-gpu cdi generate`)",
            top,
            describe_value(version),
            VERSION
        ));
    }
    let mut work = Description::default();
    for (i, item) in list(field(value, "symlinks", top)?, "symlinks")?.iter().enumerate() {
        let pair = tuple(item, 2, &format!("symlinks[{}]", i))?;
        let target = string(&pair[1], &format!("symlinks[{}] target", i))?;
        if target.is_empty() || target.contains('\n') {
            return bad(format!("symlinks[{}]: bad target {}", i, py_repr(cut(&target, 100))));
        }
        work.symlinks.push(Symlink { path: path(&pair[0], &format!("symlinks[{}]", i))?, target });
    }
    for (i, item) in list(field(value, "ldconfig_folders", top)?, "ldconfig_folders")?.iter().enumerate() {
        work.ldconfig_folders.push(path(item, &format!("ldconfig_folders[{}]", i))?);
    }
    for (i, item) in list(field(value, "ld_cache_entries", top)?, "ld_cache_entries")?.iter().enumerate() {
        let what = format!("ld_cache_entries[{}]", i);
        let fields = tuple(item, 6, &what)?;
        let name = string(&fields[0], &what)?;
        if name.is_empty() || name.contains('/') || name.contains('\n') {
            return bad(format!("{}: bad name {}", what, py_repr(cut(&name, 100))));
        }
        work.ld_cache_entries.push(LdCacheEntry {
            name,
            path: path(&fields[1], &what)?,
            flags: integer(&fields[2], &format!("{} flags", what), i32::MIN as i64, i32::MAX as i64)? as i32,
            is_64bit: boolean(&fields[3], &format!("{} is_64bit", what))?,
            hwcap: integer(&fields[4], &format!("{} hwcap", what), 0, i64::MAX)? as u64,
            osversion: integer(&fields[5], &format!("{} osversion", what), 0, u32::MAX as i64)? as u32,
        });
    }
    work.ld_cache = match field(value, "ld_cache", top)?.as_str() {
        Some("merge") => LdCacheMode::Merge,
        Some("rebuild") => LdCacheMode::Rebuild,
        _ => return bad("ld_cache is not \"merge\" or \"rebuild\""),
    };
    work.ldconfig = path(field(value, "ldconfig", top)?, "ldconfig")?;
    work.proc_source = match field(value, "proc_source", top)? {
        Value::Null => None,
        other => Some(path(other, "proc_source")?),
    };
    work.ipc_root = path(field(value, "ipc_root", top)?, "ipc_root")?;
    for (i, item) in list(field(value, "ipc", top)?, "ipc")?.iter().enumerate() {
        let what = format!("ipc[{}]", i);
        let fields = tuple(item, 3, &what)?;
        let kind = match fields[1].as_str() {
            Some("socket") => EntryKind::Socket,
            Some("directory") => EntryKind::Directory,
            _ => return bad(format!("{}: the kind is not \"socket\" or \"directory\"", what)),
        };
        work.ipc.push(IpcCandidate {
            endpoint: IpcEndpoint { path: path(&fields[0], &what)?, kind },
            source: path(&fields[2], &format!("{} source", what))?,
        });
    }
    work.cuda_compat = boolean(field(value, "cuda_compat", top)?, "cuda_compat")?;
    work.driver_version = string(field(value, "driver_version", top)?, "driver_version")?;
    if work.driver_version.chars().count() > 64 || work.driver_version.chars().any(|c| c.is_control()) {
        return bad(format!("bad driver version {}", py_repr(cut(&work.driver_version, 64))));
    }
    work.graphics = boolean(field(value, "graphics", top)?, "graphics")?;
    work.nvidia_major = optional_integer(field(value, "nvidia_major", top)?, "nvidia_major", 0, 4095)?;
    work.caps_major = optional_integer(field(value, "caps_major", top)?, "caps_major", 0, 4095)?;
    for (i, item) in list(field(value, "gpus", top)?, "gpus")?.iter().enumerate() {
        let what = format!("gpus[{}]", i);
        let fields = tuple(item, 2, &what)?;
        let bus_id = string(&fields[1], &format!("{} bus id", what))?;
        if !is_bus_id(&bus_id) {
            return bad(format!("bad bus id {}", py_repr(cut(&bus_id, 100))));
        }
        work.gpus.push(GpuDevice { minor: integer(&fields[0], &what, 0, MAX_DEVICE_NUMBER)?, bus_id });
    }
    for (i, item) in list(field(value, "gpu_instances", top)?, "gpu_instances")?.iter().enumerate() {
        let what = format!("gpu_instances[{}]", i);
        let fields = tuple(item, 4, &what)?;
        let mut instance = GpuInstance {
            // The driver's names: gpu0..gpu31, gi0..gi14, ci0..ci7 (engine.migfs).
            gpu: integer(&fields[0], &format!("{} gpu", what), 0, 31)?,
            gi: integer(&fields[1], &format!("{} gi", what), 0, 14)?,
            minor: integer(&fields[2], &format!("{} minor", what), 0, MAX_DEVICE_NUMBER)?,
            compute_instances: Vec::new(),
        };
        for (j, ci) in list(&fields[3], &what)?.iter().enumerate() {
            let pair = tuple(ci, 2, &format!("{}[{}]", what, j))?;
            instance.compute_instances.push(ComputeInstance {
                ci: integer(&pair[0], &format!("{} ci", what), 0, 7)?,
                minor: integer(&pair[1], &format!("{} ci minor", what), 0, MAX_DEVICE_NUMBER)?,
            });
        }
        work.gpu_instances.push(instance);
    }
    work.monitor_minor = optional_integer(field(value, "monitor_minor", top)?, "monitor_minor", 0, MAX_DEVICE_NUMBER)?;
    work.config_minor = optional_integer(field(value, "config_minor", top)?, "config_minor", 0, MAX_DEVICE_NUMBER)?;
    Ok(work)
}

fn describe_value(value: &Value) -> String {
    match value {
        Value::Int(n) => n.to_string(),
        Value::Str(s) => py_repr(cut(s, 20)),
        _ => "unknown".to_string(),
    }
}

/// `root.path`, the character devices and the mounts of the bundle's config.
pub fn read_bundle(config: &Value, bundle: &str) -> Result<Bundle> {
    let root_path = match config.get("root").and_then(|root| root.get("path")).and_then(Value::as_str) {
        Some(path) if !path.is_empty() => path.to_string(),
        _ => return bad(format!("{}/config.json has no root.path", bundle)),
    };
    let mut char_devices = Vec::new();
    let devices = config.get("linux").and_then(|linux| linux.get("devices")).and_then(Value::as_array);
    for device in devices.unwrap_or(&[]) {
        if device.get("type").and_then(Value::as_str) != Some("c") {
            continue;
        }
        if let (Some(major), Some(minor)) =
            (device.get("major").and_then(Value::as_i64), device.get("minor").and_then(Value::as_i64))
        {
            char_devices.push((major, minor));
        }
    }
    let mut mounts = Vec::new();
    for mount in config.get("mounts").and_then(Value::as_array).unwrap_or(&[]) {
        if let (Some(source), Some(destination)) =
            (mount.get("source").and_then(Value::as_str), mount.get("destination").and_then(Value::as_str))
        {
            mounts.push((source.to_string(), destination.to_string()));
        }
    }
    Ok(Bundle { root_path, char_devices, mounts })
}

// ------------------------------------------------------------------ choosing

/// The container's start work: what its devices choose from the description.
pub fn start_work(description: &Description, bundle: &Bundle, container: &str) -> StartWork {
    let minors_of = |major: Option<i64>| -> BTreeSet<i64> {
        match major {
            Some(major) => bundle.char_devices.iter().filter(|(m, _)| *m == major).map(|(_, minor)| *minor).collect(),
            None => BTreeSet::new(),
        }
    };
    let gpu_nodes = minors_of(description.nvidia_major);
    let cap_nodes = minors_of(description.caps_major);
    let by_minor: BTreeMap<i64, &GpuDevice> = description.gpus.iter().map(|g| (g.minor, g)).collect();

    let mut parents = BTreeSet::new();
    let mut caps = BTreeSet::new();
    for gi in &description.gpu_instances {
        // A GPU node needs the nvidia major: without it no MIG device can be told (mig_devices_in).
        if !by_minor.contains_key(&gi.gpu) || !gpu_nodes.contains(&gi.gpu) || !cap_nodes.contains(&gi.minor) {
            continue;
        }
        for ci in gi.compute_instances.iter().filter(|ci| cap_nodes.contains(&ci.minor)) {
            parents.insert(gi.gpu);
            caps.insert(format!("gpu{}/mig/gi{}/access", gi.gpu, gi.gi));
            caps.insert(format!("gpu{}/mig/gi{}/ci{}/access", gi.gpu, gi.gi, ci.ci));
        }
    }
    let whole: Vec<&GpuDevice> =
        description.gpus.iter().filter(|g| gpu_nodes.contains(&g.minor) && !parents.contains(&g.minor)).collect();
    let mut physical: BTreeSet<i64> = whole.iter().map(|g| g.minor).collect();
    physical.extend(parents.iter().copied());

    let granted = |minor: Option<i64>| minor.map_or(false, |m| cap_nodes.contains(&m));
    if granted(description.monitor_minor) {
        caps.insert("mig/monitor".to_string());
    }
    let config = granted(description.config_minor);
    if config {
        caps.insert("mig/config".to_string());
        // Config reaches every instance of its GPUs (creating one needs no node;
        // using or destroying one does).
        for gi in description.gpu_instances.iter().filter(|gi| physical.contains(&gi.gpu)) {
            caps.insert(format!("gpu{}/mig/gi{}/access", gi.gpu, gi.gi));
            for ci in &gi.compute_instances {
                caps.insert(format!("gpu{}/mig/gi{}/ci{}/access", gi.gpu, gi.gi, ci.ci));
            }
        }
    }

    let mut visible: Vec<String> =
        physical.iter().filter_map(|minor| by_minor.get(minor)).map(|g| g.bus_id.clone()).collect();
    visible.sort();
    visible.dedup();

    let mut app_profile = String::new();
    if description.graphics && !whole.is_empty() && whole.len() < description.gpus.len() {
        let mut minors: Vec<i64> = whole.iter().map(|g| g.minor).collect();
        minors.sort_unstable();
        if minors.iter().all(|m| *m <= MAX_PROFILE_MINOR) {
            app_profile = app_profile_text(&minors);
        }
    }

    let mut ipc: Vec<IpcEndpoint> = description
        .ipc
        .iter()
        .filter(|c| bundle.mounts.iter().any(|(source, dest)| *dest == c.endpoint.path && *source == c.source))
        .map(|c| c.endpoint.clone())
        .collect();
    ipc.sort_by(|a, b| a.path.cmp(&b.path));
    ipc.dedup_by(|a, b| a.path == b.path);

    StartWork {
        container: container.to_string(),
        visible_bus_ids: visible,
        symlinks: description.symlinks.clone(),
        ldconfig_folders: description.ldconfig_folders.clone(),
        proc_source: description.proc_source.clone(),
        ld_cache_entries: description.ld_cache_entries.clone(),
        ld_cache: description.ld_cache,
        ldconfig: description.ldconfig.clone(),
        ipc,
        ipc_root: description.ipc_root.clone(),
        proc_caps: caps.into_iter().collect(),
        proc_caps_all: config,
        cuda_compat: description.cuda_compat,
        driver_version: description.driver_version.clone(),
        app_profile,
    }
}

/// The profile that shows EGL and Vulkan the devices `minors` only
/// (`engine.graphics.app_profile_text`, libnvidia-container's text).
pub fn app_profile_text(minors: &[i64]) -> String {
    let mask = minors.iter().fold(0u64, |mask, minor| mask | (1u64 << minor));
    format!(
        "{{\"profiles\": [{{\"name\": \"_container_\", \"settings\": [\"EGLVisibleDGPUDevices\", {:#x}]}}],\n \"rules\": [{{\"pattern\": [], \"profile\": \"_container_\"}}]}}\n",
        mask
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node() -> Description {
        Description {
            nvidia_major: Some(195),
            caps_major: Some(237),
            gpus: vec![
                GpuDevice { minor: 2, bus_id: "0000:07:00.0".into() },
                GpuDevice { minor: 0, bus_id: "0000:0a:00.0".into() },
                GpuDevice { minor: 1, bus_id: "0000:41:00.0".into() },
            ],
            gpu_instances: vec![
                GpuInstance { gpu: 1, gi: 1, minor: 12, compute_instances: vec![ComputeInstance { ci: 0, minor: 13 }] },
                GpuInstance { gpu: 1, gi: 2, minor: 21, compute_instances: vec![] },
            ],
            monitor_minor: Some(2),
            config_minor: Some(1),
            graphics: true,
            ..Description::default()
        }
    }

    fn bundle(devices: &[(i64, i64)]) -> Bundle {
        Bundle { root_path: "rootfs".into(), char_devices: devices.to_vec(), mounts: vec![] }
    }

    #[test]
    fn whole_gpus_by_their_nodes() {
        let work = start_work(&node(), &bundle(&[(195, 0), (195, 2), (195, 255)]), "c");
        assert_eq!(work.visible_bus_ids, vec!["0000:07:00.0", "0000:0a:00.0"]);
        assert!(work.proc_caps.is_empty());
        assert!(work.app_profile.contains("0x5"), "{}", work.app_profile);
    }

    #[test]
    fn a_mig_device_shows_its_parent_and_its_two_files_not_a_profile() {
        let work = start_work(&node(), &bundle(&[(195, 1), (237, 12), (237, 13)]), "c");
        assert_eq!(work.visible_bus_ids, vec!["0000:41:00.0"]);
        assert_eq!(work.proc_caps, vec!["gpu1/mig/gi1/access", "gpu1/mig/gi1/ci0/access"]);
        assert_eq!(work.app_profile, "");
        assert!(!work.proc_caps_all);
    }

    #[test]
    fn a_gi_cap_alone_is_no_mig_device() {
        let work = start_work(&node(), &bundle(&[(195, 1), (237, 12)]), "c");
        assert_eq!(work.visible_bus_ids, vec!["0000:41:00.0"]);
        assert!(work.proc_caps.is_empty());
    }

    #[test]
    fn config_shows_every_instance_of_the_gpus() {
        let work = start_work(&node(), &bundle(&[(195, 1), (237, 1), (237, 2)]), "c");
        assert!(work.proc_caps_all);
        assert_eq!(
            work.proc_caps,
            vec!["gpu1/mig/gi1/access", "gpu1/mig/gi1/ci0/access", "gpu1/mig/gi2/access", "mig/config", "mig/monitor"]
        );
    }

    #[test]
    fn every_gpu_is_no_profile() {
        let work = start_work(&node(), &bundle(&[(195, 0), (195, 1), (195, 2)]), "c");
        assert_eq!(work.app_profile, "");
        assert_eq!(work.visible_bus_ids.len(), 3);
    }

    #[test]
    fn no_device_shows_no_gpu() {
        let work = start_work(&node(), &bundle(&[(1, 3)]), "c");
        assert!(work.visible_bus_ids.is_empty());
    }

    /// The MIG node of the Python tests: GPUs 0-3 (minor = index), GPU 2 with GI 2
    /// (CIs 0 and 1) and GI 3 (CI 0), monitor and config caps.
    fn mig_node() -> Description {
        let gi = |gi: i64, minor: i64, cis: &[(i64, i64)]| GpuInstance {
            gpu: 2,
            gi,
            minor,
            compute_instances: cis.iter().map(|&(ci, minor)| ComputeInstance { ci, minor }).collect(),
        };
        Description {
            nvidia_major: Some(195),
            caps_major: Some(237),
            gpus: (0..4).map(|i| GpuDevice { minor: i, bus_id: format!("0000:0{}:00.0", i) }).collect(),
            gpu_instances: vec![gi(2, 21, &[(0, 22), (1, 23)]), gi(3, 30, &[(0, 31)])],
            monitor_minor: Some(2),
            config_minor: Some(1),
            graphics: true,
            ..Description::default()
        }
    }

    fn bus(ids: &[i64]) -> Vec<String> {
        ids.iter().map(|i| format!("0000:0{}:00.0", i)).collect()
    }

    fn caps(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn whole_gpus_and_mig_devices_together() {
        let devices = [(195, 3), (195, 2), (237, 30), (237, 31), (237, 21), (237, 22), (195, 0)];
        let work = start_work(&mig_node(), &bundle(&devices), "c");
        assert_eq!(work.visible_bus_ids, bus(&[0, 2, 3]));
        assert_eq!(
            work.proc_caps,
            caps(&["gpu2/mig/gi2/access", "gpu2/mig/gi2/ci0/access", "gpu2/mig/gi3/access", "gpu2/mig/gi3/ci0/access"])
        );
        assert!(!work.proc_caps_all);
        // The profile counts the whole GPUs only, not the MIG parent.
        assert_eq!(work.app_profile, app_profile_text(&[0, 3]));
    }

    #[test]
    fn every_device_of_the_spec_all() {
        let devices = [(195, 0), (195, 1), (195, 3), (195, 2), (237, 21), (237, 22), (237, 23), (237, 30), (237, 31)];
        let work = start_work(&mig_node(), &bundle(&devices), "c");
        assert_eq!(work.visible_bus_ids, bus(&[0, 1, 2, 3]));
        assert_eq!(
            work.proc_caps,
            caps(&[
                "gpu2/mig/gi2/access",
                "gpu2/mig/gi2/ci0/access",
                "gpu2/mig/gi2/ci1/access",
                "gpu2/mig/gi3/access",
                "gpu2/mig/gi3/ci0/access"
            ])
        );
        assert_eq!(work.app_profile, app_profile_text(&[0, 1, 3]));
    }

    #[test]
    fn a_mig_device_needs_all_three_nodes() {
        // Parent and CI cap without the GI cap: the whole GPU.
        let work = start_work(&mig_node(), &bundle(&[(195, 2), (237, 22)]), "c");
        assert_eq!((work.visible_bus_ids, work.proc_caps), (bus(&[2]), caps(&[])));
        // GI and CI caps without the parent node: nothing.
        let work = start_work(&mig_node(), &bundle(&[(237, 21), (237, 22)]), "c");
        assert_eq!((work.visible_bus_ids, work.proc_caps), (bus(&[]), caps(&[])));
        // The caps' minors under another major: the whole GPU.
        let work = start_work(&mig_node(), &bundle(&[(195, 2), (236, 21), (236, 22)]), "c");
        assert_eq!((work.visible_bus_ids, work.proc_caps), (bus(&[2]), caps(&[])));
    }

    #[test]
    fn the_grants_alone() {
        let work = start_work(&mig_node(), &bundle(&[(237, 2)]), "c");
        assert_eq!(
            (work.visible_bus_ids, work.proc_caps, work.proc_caps_all),
            (bus(&[]), caps(&["mig/monitor"]), false)
        );
        let work = start_work(&mig_node(), &bundle(&[(237, 1)]), "c");
        assert_eq!((work.visible_bus_ids, work.proc_caps, work.proc_caps_all), (bus(&[]), caps(&["mig/config"]), true));
    }

    #[test]
    fn a_node_without_instances_grants_the_monitor() {
        let mut node = mig_node();
        node.gpu_instances.clear();
        let work = start_work(&node, &bundle(&[(195, 1), (237, 2)]), "c");
        assert_eq!((work.visible_bus_ids, work.proc_caps), (bus(&[1]), caps(&["mig/monitor"])));
    }

    #[test]
    fn no_nvidia_major_no_gpu_but_the_grants() {
        let mut node = mig_node();
        node.nvidia_major = None;
        let work = start_work(&node, &bundle(&[(195, 2), (237, 21), (237, 22), (237, 2)]), "c");
        assert_eq!((work.visible_bus_ids, work.proc_caps), (bus(&[]), caps(&["mig/monitor"])));
    }

    #[test]
    fn the_profile_edges() {
        let mut node = mig_node();
        node.graphics = false;
        assert_eq!(start_work(&node, &bundle(&[(195, 0)]), "c").app_profile, "");
        let mut node = mig_node();
        node.gpus[1].minor = 32; // past the driver's 32-bit mask
        assert_eq!(start_work(&node, &bundle(&[(195, 32)]), "c").app_profile, "");
        assert_eq!(start_work(&node, &bundle(&[(195, 0)]), "c").app_profile, app_profile_text(&[0]));
        // A GPU instance whose GPU the node does not list is no MIG device.
        let mut node = mig_node();
        node.gpu_instances[0].gpu = 9;
        let work = start_work(&node, &bundle(&[(195, 9), (237, 21), (237, 22)]), "c");
        assert_eq!((work.visible_bus_ids, work.proc_caps), (bus(&[]), caps(&[])));
    }

    #[test]
    fn the_ipc_endpoints_are_the_mounts_from_their_host_source() {
        let mut node = node();
        let candidate = |path: &str, source: &str| IpcCandidate {
            endpoint: IpcEndpoint { path: path.into(), kind: EntryKind::Socket },
            source: source.into(),
        };
        node.ipc =
            vec![candidate("/run/b/socket", "/drv/run/b/socket"), candidate("/run/a/socket", "/drv/run/a/socket")];
        let mut given = bundle(&[]);
        given.mounts = vec![
            ("/elsewhere/socket".into(), "/run/b/socket".into()), // another source: not ours
            ("/drv/run/a/socket".into(), "/run/a/socket".into()),
            ("/drv/run/a/socket".into(), "/run/a/socket".into()), // twice: once
            ("/drv/usr/lib/libcuda.so.1".into(), "/usr/lib/libcuda.so.1".into()),
        ];
        let work = start_work(&node, &given, "c");
        assert_eq!(work.ipc.iter().map(|e| e.path.as_str()).collect::<Vec<_>>(), vec!["/run/a/socket"]);
        given.mounts.push(("/drv/run/b/socket".into(), "/run/b/socket".into()));
        let work = start_work(&node, &given, "c");
        assert_eq!(
            work.ipc.iter().map(|e| e.path.as_str()).collect::<Vec<_>>(),
            vec!["/run/a/socket", "/run/b/socket"]
        );
    }

    #[test]
    fn the_spec_wide_work_is_copied_as_it_is() {
        let mut node = node();
        node.symlinks = vec![Symlink { path: "/usr/lib/libcuda.so.1".into(), target: "libcuda.so.550".into() }];
        node.ldconfig_folders = vec!["/usr/lib".into()];
        node.ld_cache = LdCacheMode::Rebuild;
        node.ldconfig = "/sbin/ldconfig".into();
        node.proc_source = Some("/sim/proc/driver/nvidia".into());
        node.ipc_root = "/drv".into();
        node.cuda_compat = true;
        node.driver_version = "550.163.01".into();
        let work = start_work(&node, &bundle(&[]), "container x");
        assert_eq!(work.container, "container x");
        assert_eq!(work.symlinks, node.symlinks);
        assert_eq!(work.ldconfig_folders, node.ldconfig_folders);
        assert_eq!((work.ld_cache, work.ldconfig.as_str()), (LdCacheMode::Rebuild, "/sbin/ldconfig"));
        assert_eq!(work.proc_source.as_deref(), Some("/sim/proc/driver/nvidia"));
        assert_eq!(
            (work.ipc_root.as_str(), work.cuda_compat, work.driver_version.as_str()),
            ("/drv", true, "550.163.01")
        );
    }

    fn parse(text: &str) -> Value {
        crate::json::parse(text.as_bytes(), 64).expect("test JSON")
    }

    #[test]
    fn the_bundle_keeps_character_devices_with_integer_numbers_only() {
        let config = parse(
            r#"{"root": {"path": "rootfs"}, "linux": {"devices": [
                {"type": "c", "major": 195, "minor": 0},
                {"type": "b", "major": 195, "minor": 1},
                {"type": "c", "major": 195, "minor": true},
                {"type": "c", "major": 195, "minor": "2"},
                {"type": "c", "major": 195.0, "minor": 3},
                [195, 4], "c",
                {"type": "c", "major": 195, "minor": 5}]},
              "mounts": [{"source": "/a", "destination": "/b"}, {"source": 1, "destination": "/c"}, {}]}"#,
        );
        let found = read_bundle(&config, "/b").unwrap();
        assert_eq!(found.root_path, "rootfs");
        assert_eq!(found.char_devices, vec![(195, 0), (195, 5)]);
        assert_eq!(found.mounts, vec![("/a".to_string(), "/b".to_string())]);
        let bare = read_bundle(&parse(r#"{"root": {"path": "/abs/rootfs"}}"#), "/b").unwrap();
        assert!(bare.char_devices.is_empty() && bare.mounts.is_empty());
        for bad in [r#"{}"#, r#"{"root": {}}"#, r#"{"root": {"path": ""}}"#, r#"{"root": {"path": 5}}"#] {
            assert_eq!(
                read_bundle(&parse(bad), "/b"),
                Err(BadInput("/b/config.json has no root.path".into())),
                "{}",
                bad
            );
        }
    }

    const GOOD: &str = r#"{"version": 1, "symlinks": [["/usr/lib/libcuda.so.1", "libcuda.so.550"]],
        "ldconfig_folders": ["/usr/lib"], "ld_cache_entries": [["libcuda.so.1", "/usr/lib/libcuda.so.1", 771, true, 0, 0]],
        "ld_cache": "merge", "ldconfig": "/sbin/ldconfig", "proc_source": null, "ipc_root": "/",
        "ipc": [["/run/nvidia-persistenced/socket", "socket", "/run/nvidia-persistenced/socket"]],
        "cuda_compat": true, "driver_version": "550.163.01", "graphics": false, "nvidia_major": 195,
        "caps_major": null, "gpus": [[0, "0000:07:00.0"]], "gpu_instances": [[0, 1, 12, [[0, 13]]]],
        "monitor_minor": null, "config_minor": 1}"#;

    #[test]
    fn a_description_is_read_whole() {
        let read = read_description(&parse(GOOD)).unwrap();
        assert_eq!(
            read.symlinks,
            vec![Symlink { path: "/usr/lib/libcuda.so.1".into(), target: "libcuda.so.550".into() }]
        );
        assert_eq!(read.ld_cache_entries[0].flags, 771);
        assert_eq!(read.ipc[0].endpoint.kind, EntryKind::Socket);
        assert_eq!((read.nvidia_major, read.caps_major, read.config_minor), (Some(195), None, Some(1)));
        assert_eq!(read.gpu_instances[0].compute_instances, vec![ComputeInstance { ci: 0, minor: 13 }]);
    }

    #[test]
    fn a_bad_description_is_refused_by_name() {
        for (from, to, named) in [
            (r#""version": 1"#, r#""version": 2"#, "of version 2"),
            (r#""ldconfig_folders": ["/usr/lib"]"#, r#""ldconfig_folders": ["usr/lib"]"#, "ldconfig_folders[0]"),
            (
                r#""ldconfig_folders": ["/usr/lib"]"#,
                r#""ldconfig_folders": ["/usr/../lib"]"#,
                "not a clean absolute path",
            ),
            (r#""ld_cache": "merge""#, r#""ld_cache": "fast""#, "ld_cache"),
            (r#"[0, "0000:07:00.0"]"#, r#"[0, "../x"]"#, "bad bus id"),
            (r#"[0, "0000:07:00.0"]"#, r#"[-1, "0000:07:00.0"]"#, "gpus[0]"),
            (r#"[0, 1, 12, [[0, 13]]]"#, r#"[0, 15, 12, [[0, 13]]]"#, "gpu_instances[0] gi"),
            (r#"[0, 1, 12, [[0, 13]]]"#, r#"[0, 1, 12, [[8, 13]]]"#, "ci"),
            (r#""nvidia_major": 195"#, r#""nvidia_major": "195""#, "nvidia_major"),
            (r#""graphics": false"#, r#""graphics": 0"#, "graphics"),
            (r#""proc_source": null"#, r#""proc_source": "proc""#, "proc_source"),
            (
                r#""libcuda.so.1", "/usr/lib/libcuda.so.1", 771"#,
                r#""lib/cuda.so.1", "/usr/lib/libcuda.so.1", 771"#,
                "bad name",
            ),
            (r#", "config_minor": 1"#, "", "has no config_minor"),
        ] {
            let text = GOOD.replace(from, to);
            assert_ne!(text, GOOD, "{}", from);
            let found = read_description(&parse(&text));
            assert!(matches!(&found, Err(BadInput(m)) if m.contains(named)), "{} -> {:?}", to, found);
        }
        assert!(read_description(&parse("[]")).is_err());
    }

    #[test]
    fn the_profile_text_is_libnvidia_containers() {
        assert_eq!(
            app_profile_text(&[0, 2]),
            "{\"profiles\": [{\"name\": \"_container_\", \"settings\": [\"EGLVisibleDGPUDevices\", 0x5]}],\n \"rules\": [{\"pattern\": [], \"profile\": \"_container_\"}]}\n"
        );
    }
}
