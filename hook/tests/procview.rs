//! The procfs view (`procview`, `procsource`) built on a fake container root, as
//! tests/integration/test_start.py and test_start_mig.py hold the Python's on
//! runc containers: a simulated node's `proc/driver` tree (the layout of
//! hack/testbed/gpunode.py), a container root whose `/proc` is a real procfs
//! mount (no driver in it: the view goes over `/proc/driver`, as on a simulated
//! node), and the results read back through /proc/self/mountinfo and the files.
//!
//! `harness = false`: the mounts need a private mount namespace, and
//! `unshare(CLONE_NEWNS)` is refused in a multi-threaded process such as
//! libtest's runner. Needs root; skipped with a message otherwise.
//!
//! A real node's driver procfs cannot be had without the driver: the
//! `DriverProcfs` cases attach a simulated node's tree over the container's
//! `/proc/driver` first (as the Python's `_attach`), so the container's own
//! `/proc/driver/nvidia` is a plain directory standing in for the driver's.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::io::ErrorKind;
use std::os::raw::{c_char, c_int, c_uint};
use std::os::unix::fs::{symlink, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use common::{cstr, path_str, write};
use nri_gpu_hook::procsource::{self, params_with_device_modification_disabled, ProcSource};
use nri_gpu_hook::procview::{self, MARKER};
use nri_gpu_hook::rootdir::RootDir;
use nri_gpu_hook::sys;

extern "C" {
    fn mkfifo(path: *const c_char, mode: c_uint) -> c_int;
}

/// The simulated node's GPUs (bus ids of a DGX A100; minor = index).
const BUS: [&str; 4] = ["0000:07:00.0", "0000:0f:00.0", "0000:47:00.0", "0000:4e:00.0"];
const LOCKED: [&str; 4] = ["ro", "nosuid", "nodev", "noexec"];
const PARAMS: &str = "ResmanDebugLevel: 4294967295\nRmLogonRC: 1\nModifyDeviceFiles: 1\nDeviceFileUID: 0\n\
                      DeviceFileGID: 0\nDeviceFileMode: 438\nImexChannelCount: 2048\nRegistryDwords: \"\"\n\
                      ExcludedGpus: \"\"\n";
const VERSION: &str = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.163.01  Tue Apr  8 12:41:17 UTC 2025\n\
                       GCC version:  gcc version 14.2.0 (Debian 14.2.0-19) \n";

fn main() {
    let scratch = match common::Scratch::enter("procview", "a private mount namespace and mounts") {
        Some(scratch) => scratch,
        None => return,
    };
    let base = scratch.base.clone();

    let tests: Vec<(&str, Test)> = vec![
        ("the_view_is_a_locked_tmpfs", the_view_is_a_locked_tmpfs),
        ("a_second_run_changes_nothing", a_second_run_changes_nothing),
        ("other_gpus_replace_the_view", other_gpus_replace_the_view),
        ("no_gpu_hides_them_all", no_gpu_hides_them_all),
        ("an_unknown_bus_id_is_named", an_unknown_bus_id_is_named),
        ("an_unfinished_view_is_replaced", an_unfinished_view_is_replaced),
        ("a_view_of_other_work_is_replaced", a_view_of_other_work_is_replaced),
        ("the_containers_own_driver_tree_is_the_source_on_a_real_node", the_containers_own_tree_on_a_real_node),
        ("a_real_node_without_a_driver_tree", a_real_node_without_a_driver_tree),
        ("a_host_directorys_links_and_fifos_are_refused", a_host_directorys_links_and_fifos_are_refused),
        ("a_containers_own_planted_link_is_refused", a_containers_own_planted_link_is_refused),
        ("a_mig_device_sees_exactly_its_two_access_files", a_mig_device_sees_exactly_its_two_access_files),
        ("the_cap_files_are_locked_binds", the_cap_files_are_locked_binds),
        ("monitor_and_config_are_shown_when_granted", monitor_and_config_are_shown_when_granted),
        ("no_caps_no_capabilities_folder", no_caps_no_capabilities_folder),
        ("all_caps_show_the_whole_folder_live", all_caps_show_the_whole_folder_live),
        ("the_same_caps_keep_the_view_others_replace_it", the_same_caps_keep_the_view_others_replace_it),
        ("a_cap_missing_at_start_is_named", a_cap_missing_at_start_is_named),
        ("a_cap_symlink_or_non_file_is_refused", a_cap_symlink_or_non_file_is_refused),
        ("a_cap_name_not_the_drivers_is_refused", a_cap_name_not_the_drivers_is_refused),
        ("a_failure_after_attaching_leaves_no_view", a_failure_after_attaching_leaves_no_view),
    ];
    let summary = common::run_cases("procview", &base, &tests, |dir| Env { dir });
    scratch.leave();
    summary.finish();
}

type Test = fn(&Env);

struct Env {
    dir: PathBuf,
}

// ---------------------------------------------------------------- the simulated node

/// A simulated node's `proc` under `env.dir/<name>`: `driver/nvidia/{version,params,registry}`,
/// `gpus/<bus>/{information,registry,power}` for the four GPUs, `capabilities/` with
/// `mig/{config,monitor}`, `fabric-imex-mgmt`, every GPU's `gpu<M>/mig/` and, on GPU 2,
/// instances gi2 (ci0, ci1) and gi3 (ci0); and `driver/nvidia-caps/mig-minors`.
struct Node {
    proc_root: PathBuf,
}

impl Node {
    fn nvidia(&self) -> PathBuf {
        self.proc_root.join("driver/nvidia")
    }
    fn caps(&self) -> PathBuf {
        self.nvidia().join("capabilities")
    }
    fn source(&self) -> ProcSource {
        procsource::source_for(Some(path_str(&self.nvidia())))
    }
}

fn build_node(env: &Env, name: &str) -> Node {
    let proc_root = env.dir.join(name).join("proc");
    let nv = proc_root.join("driver/nvidia");
    write(&nv.join("version"), VERSION, 0o444);
    write(&nv.join("params"), PARAMS, 0o444);
    write(&nv.join("registry"), "Binary: \"\"\n", 0o644);
    for (minor, bus) in BUS.iter().enumerate() {
        let gpu = nv.join("gpus").join(bus);
        write(
            &gpu.join("information"),
            &format!("Model: \t\t NVIDIA A100-SXM4-40GB\nBus Location: \t {}\nDevice Minor: \t {}\n", bus, minor),
            0o444,
        );
        write(&gpu.join("registry"), "Binary: \"\"\n", 0o644);
        write(&gpu.join("power"), "Runtime D3 status:          Not supported\n", 0o444);
    }
    let caps = nv.join("capabilities");
    write(&caps.join("mig/config"), "DeviceFileMinor: 1\nDeviceFileMode: 256\nDeviceFileModify: 1\n", 0o444);
    write(&caps.join("mig/monitor"), "DeviceFileMinor: 2\nDeviceFileMode: 292\nDeviceFileModify: 1\n", 0o444);
    write(&caps.join("fabric-imex-mgmt"), "DeviceFileMinor: 3\nDeviceFileMode: 256\nDeviceFileModify: 1\n", 0o444);
    for minor in 0..BUS.len() {
        fs::create_dir_all(caps.join(format!("gpu{}/mig", minor))).expect("mkdir");
    }
    for (gi, cis) in [(2, vec![0, 1]), (3, vec![0])] {
        let folder = caps.join(format!("gpu2/mig/gi{}", gi));
        write(&folder.join("access"), &access_file(cap_minor(gi, None)), 0o444);
        for ci in cis {
            write(&folder.join(format!("ci{}/access", ci)), &access_file(cap_minor(gi, Some(ci))), 0o444);
        }
    }
    write(&proc_root.join("driver/nvidia-caps/mig-minors"), "config 1\nmonitor 2\n", 0o444);
    let node = Node { proc_root };
    chmod_folders(&node.caps(), 0o555);
    node
}

fn cap_minor(gi: u32, ci: Option<u32>) -> u32 {
    let base = 3 + 135 * 2 + 9 * gi;
    ci.map_or(base, |ci| base + 1 + ci)
}

fn access_file(minor: u32) -> String {
    format!("DeviceFileMinor: {}\nDeviceFileMode: 292\nDeviceFileModify: 1\n", minor)
}

/// GPU 2's MIG device: its GPU instance's and its compute instance's access files.
fn device_caps(gi: u32, ci: u32) -> Vec<String> {
    vec![format!("gpu2/mig/gi{}/access", gi), format!("gpu2/mig/gi{}/ci{}/access", gi, ci)]
}

// ---------------------------------------------------------------- the container

/// A container root under `env.dir/<name>`, with a procfs of its own at `/proc`
/// (`procfs`) unless this machine's procfs has a driver tree: then `/proc/driver`
/// is a plain folder, the container's procfs being a simulated node's (no driver).
struct Container {
    path: PathBuf,
    root: RootDir,
    procfs: bool,
}

impl Container {
    fn at(&self, path: &str) -> PathBuf {
        self.path.join(path.trim_start_matches('/'))
    }
    fn mount_point(&self, path: &str) -> String {
        path_str(&self.at(path)).to_string()
    }
}

fn container(env: &Env, name: &str) -> Container {
    let path = env.dir.join(name);
    fs::create_dir_all(path.join("proc")).expect("mkdir proc");
    common::mount_at("proc", &path.join("proc"), Some("proc"), 0);
    let procfs = !path.join("proc/driver/nvidia").exists();
    if !procfs {
        let proc = path_str(&path.join("proc")).to_string();
        sys::umount2_name(&proc, sys::MNT_DETACH).expect("unmount proc");
        fs::create_dir_all(path.join("proc/driver")).expect("mkdir proc/driver");
    }
    let root = RootDir::open_path(path_str(&path)).expect("open the container root");
    Container { path, root, procfs }
}

/// `isolate` as the hook calls it: the source taken outside first, the root's
/// `nodev` copy made, and what was taken and not used released after.
fn run(
    c: &Container,
    source: &mut ProcSource,
    bus: &[&str],
    caps: &[String],
    all: bool,
) -> Result<&'static str, String> {
    let bus: Vec<String> = bus.iter().map(|b| b.to_string()).collect();
    let result = (|| {
        if source.takes_outside() {
            source.take_outside(&bus, caps, all)?;
        }
        let files = c.root.detached_copy()?;
        procview::isolate(&c.root, &bus, source, &files, caps, all)
    })();
    source.close();
    result.map_err(|e| e.0)
}

fn created(c: &Container, node: &Node, bus: &[&str], caps: &[String], all: bool) {
    assert_eq!(run(c, &mut node.source(), bus, caps, all), Ok("created"));
}

/// Bind a directory over one in the container (the Python tests' `_attach`).
fn attach(from: &Path, to: &Path) {
    let flags = sys::OPEN_TREE_CLONE | sys::OPEN_TREE_CLOEXEC | sys::AT_RECURSIVE;
    let tree = sys::open_tree(sys::AT_FDCWD, path_str(from), flags).expect("clone");
    let target = sys::openat_fd(sys::AT_FDCWD, path_str(to), sys::O_PATH | sys::O_DIRECTORY, 0).expect("target");
    sys::move_mount(tree.as_raw_fd(), "", target.as_raw_fd(), "", common::EMPTY_BOTH).expect("attach");
}

// ---------------------------------------------------------------- what the kernel shows

struct Mount {
    point: String,
    options: Vec<String>,
    optional: Vec<String>,
    fstype: String,
    source: String,
}

fn mounts() -> Vec<Mount> {
    let text = fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    text.lines()
        .map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let dash = fields.iter().position(|f| *f == "-").expect("a separator");
            Mount {
                point: fields[4].to_string(),
                options: fields[5].split(',').map(String::from).collect(),
                optional: fields[6..dash].iter().map(|f| f.to_string()).collect(),
                fstype: fields[dash + 1].to_string(),
                source: fields[dash + 2].to_string(),
            }
        })
        .collect()
}

fn mounts_at(point: &str) -> Vec<Mount> {
    mounts().into_iter().filter(|m| m.point == point).collect()
}

fn mounts_under(prefix: &str) -> Vec<Mount> {
    mounts().into_iter().filter(|m| m.point == prefix || m.point.starts_with(&format!("{}/", prefix))).collect()
}

fn assert_locked(m: &Mount) {
    for option in LOCKED.iter() {
        assert!(m.options.iter().any(|o| o == option), "{} lacks {}: {:?}", m.point, option, m.options);
    }
    assert!(m.optional.iter().all(|f| !f.starts_with("shared:")), "{} propagates: {:?}", m.point, m.optional);
}

fn names(dir: &Path) -> Vec<String> {
    let mut found: Vec<String> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {}", dir.display(), e))
        .map(|entry| entry.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    found.sort();
    found
}

fn mode(path: &Path) -> u32 {
    fs::symlink_metadata(path).unwrap_or_else(|e| panic!("{}: {}", path.display(), e)).permissions().mode() & 0o7777
}

/// "mode path" of `dir` and everything under it, paths relative to `base`, sorted
/// (the Python MIG tests' `find | stat -c '%a %n'`).
fn listing(dir: &Path, base: &Path) -> Vec<String> {
    let mut out = BTreeMap::new();
    walk(dir, base, &mut out);
    out.into_iter().map(|(path, mode)| format!("{:o} {}", mode, path)).collect()
}

fn walk(path: &Path, base: &Path, out: &mut BTreeMap<String, u32>) {
    let relative = path.strip_prefix(base).expect("under base").to_string_lossy().into_owned();
    out.insert(format!("/{}", relative), mode(path));
    if fs::symlink_metadata(path).expect("stat").is_dir() {
        for name in names(path) {
            walk(&path.join(name), base, out);
        }
    }
}

/// What a view showing `caps` lists under `/proc/driver/nvidia/capabilities`.
fn expected(caps: &[String]) -> Vec<String> {
    let root = "/proc/driver/nvidia/capabilities";
    let mut entries = BTreeMap::new();
    entries.insert(root.to_string(), 0o555);
    for cap in caps {
        let parts: Vec<&str> = cap.split('/').collect();
        for depth in 1..parts.len() {
            entries.insert(format!("{}/{}", root, parts[..depth].join("/")), 0o555);
        }
        entries.insert(format!("{}/{}", root, cap), 0o444);
    }
    entries.into_iter().map(|(path, mode)| format!("{:o} {}", mode, path)).collect()
}

fn write_error(path: &Path) -> Option<i32> {
    fs::write(path, b"x").err().and_then(|e| e.raw_os_error())
}

// ---------------------------------------------------------------- test_start.py

fn the_view_is_a_locked_tmpfs(env: &Env) {
    let node = build_node(env, "node");
    let c = container(env, "c");
    let kept = [BUS[0], BUS[2]];
    created(&c, &node, &kept, &[], false);
    let view = mounts_at(&c.mount_point("/proc/driver"));
    assert_eq!(view.len(), 1);
    assert_eq!((view[0].fstype.as_str(), view[0].source.as_str()), ("tmpfs", "nri-gpu"));
    assert_locked(&view[0]);
    let gpus = c.mount_point("/proc/driver/nvidia/gpus");
    let binds = mounts_under(&gpus);
    let mut bound: Vec<&str> = binds.iter().map(|m| m.point.rsplit('/').next().unwrap()).collect();
    bound.sort();
    assert_eq!(bound, kept);
    binds.iter().for_each(assert_locked);
    assert!(mounts_under(&c.mount_point("/proc/driver/nvidia/capabilities")).is_empty());
    // The view's files: copies, params rewritten; the host's never touched.
    let nv = c.at("/proc/driver/nvidia");
    assert_eq!(names(&c.at("/proc/driver")), [MARKER, "nvidia"]);
    assert_eq!(names(&nv), ["gpus", "params", "registry", "version"]);
    assert_eq!(names(&nv.join("gpus")), kept);
    assert_eq!(fs::read_to_string(node.nvidia().join("params")).unwrap(), PARAMS);
    let params = fs::read(nv.join("params")).unwrap();
    assert_eq!(params, params_with_device_modification_disabled(PARAMS.as_bytes()));
    assert!(String::from_utf8(params).unwrap().lines().any(|l| l == "ModifyDeviceFiles: 0"));
    assert_eq!(fs::read_to_string(nv.join("version")).unwrap(), VERSION);
    assert_eq!(
        (mode(&nv.join("version")), mode(&nv.join("registry")), mode(&nv.join("params"))),
        (0o444, 0o644, 0o444)
    );
    assert_eq!((mode(&c.at("/proc/driver")), mode(&nv), mode(&nv.join("gpus"))), (0o555, 0o555, 0o555));
    assert_eq!(
        fs::read(nv.join("gpus").join(BUS[2]).join("information")).unwrap(),
        fs::read(node.nvidia().join("gpus").join(BUS[2]).join("information")).unwrap()
    );
    let bus: Vec<String> = kept.iter().map(|b| b.to_string()).collect();
    let marker = fs::read(c.at("/proc/driver").join(MARKER)).unwrap();
    assert_eq!(marker, procview::marker_text(&bus, "host", &[], false));
    assert!(procview::is_finished(&marker));
    assert_eq!(mode(&c.at("/proc/driver").join(MARKER)), 0o444);
    // Read-only, binds included.
    assert_eq!(write_error(&nv.join("x")), Some(sys::EROFS));
    assert_eq!(write_error(&nv.join("gpus").join(BUS[0]).join("x")), Some(sys::EROFS));
    assert_eq!(write_error(&nv.join("params")), Some(sys::EROFS));
    // The container's procfs is still there under the view.
    let procfs: &[&str] = if c.procfs { &["proc"] } else { &[] };
    assert_eq!(mounts_at(&c.mount_point("/proc")).iter().map(|m| m.fstype.as_str()).collect::<Vec<_>>(), procfs);
}

fn a_second_run_changes_nothing(env: &Env) {
    let node = build_node(env, "node");
    let c = container(env, "c");
    created(&c, &node, &BUS[..2], &[], false);
    let before = fs::metadata(c.at("/proc/driver").join(MARKER)).unwrap();
    assert_eq!(run(&c, &mut node.source(), &BUS[..2], &[], false), Ok("kept"));
    let after = fs::metadata(c.at("/proc/driver").join(MARKER)).unwrap();
    assert_eq!(std::os::unix::fs::MetadataExt::ino(&before), std::os::unix::fs::MetadataExt::ino(&after));
    assert_eq!(mounts_at(&c.mount_point("/proc/driver")).len(), 1);
    let params = fs::read_to_string(c.at("/proc/driver/nvidia/params")).unwrap();
    assert!(params.lines().any(|l| l == "ModifyDeviceFiles: 0"));
}

fn other_gpus_replace_the_view(env: &Env) {
    let node = build_node(env, "node");
    let c = container(env, "c");
    created(&c, &node, &[BUS[0], BUS[2]], &[], false);
    created(&c, &node, &[BUS[3]], &[], false);
    assert_eq!(mounts_at(&c.mount_point("/proc/driver")).len(), 1);
    assert_eq!(names(&c.at("/proc/driver/nvidia/gpus")), [BUS[3]]);
    let binds = mounts_under(&c.mount_point("/proc/driver/nvidia/gpus"));
    assert_eq!(
        binds.iter().map(|m| m.point.clone()).collect::<Vec<_>>(),
        [c.mount_point("/proc/driver/nvidia/gpus/0000:4e:00.0")]
    );
}

fn no_gpu_hides_them_all(env: &Env) {
    let node = build_node(env, "node");
    let c = container(env, "c");
    created(&c, &node, &[], &[], false);
    assert!(names(&c.at("/proc/driver/nvidia/gpus")).is_empty());
    let params = fs::read_to_string(c.at("/proc/driver/nvidia/params")).unwrap();
    assert!(params.lines().any(|l| l == "ModifyDeviceFiles: 0"));
    assert_eq!(mounts_under(&c.mount_point("/proc/driver")).len(), 1);
}

fn an_unknown_bus_id_is_named(env: &Env) {
    let node = build_node(env, "node");
    let c = container(env, "c");
    let error = run(&c, &mut node.source(), &["0000:99:00.0"], &[], false);
    assert_eq!(error, Err("bus id 0000:99:00.0 is not on this node".to_string()));
    assert!(mounts_under(&c.mount_point("/proc/driver")).is_empty());
}

fn an_unfinished_view_is_replaced(env: &Env) {
    // What a hook killed halfway leaves: a view whose marker matches no work.
    let node = build_node(env, "node");
    let leftover = env.dir.join("leftover");
    fs::create_dir_all(leftover.join("nvidia/gpus")).unwrap();
    fs::write(leftover.join(MARKER), "nri-gpu procfs view 1\nunfinished\n").unwrap();
    let c = container(env, "c");
    attach(&leftover, &c.at("/proc/driver"));
    created(&c, &node, &[BUS[0], BUS[2]], &[], false);
    let view = mounts_at(&c.mount_point("/proc/driver"));
    assert_eq!(view.len(), 1);
    assert_eq!(view[0].source, "nri-gpu");
    assert_eq!(names(&c.at("/proc/driver/nvidia/gpus")), [BUS[0], BUS[2]]);
}

/// A finished view of other work is replaced (the marker names the GPUs and the source).
fn a_view_of_other_work_is_replaced(env: &Env) {
    let node = build_node(env, "node");
    let c = container(env, "c");
    created(&c, &node, &[BUS[1]], &[], false);
    // The same GPUs from another source: the marker names the source.
    let bus = vec![BUS[1].to_string()];
    let other = procview::marker_text(&bus, "container", &[], false);
    assert_ne!(fs::read(c.at("/proc/driver").join(MARKER)).unwrap(), other);
    created(&c, &node, &[BUS[1], BUS[3]], &[], false);
    assert_eq!(mounts_at(&c.mount_point("/proc/driver")).len(), 1);
    assert_eq!(mounts_under(&c.mount_point("/proc/driver")).len(), 3);
}

fn the_containers_own_tree_on_a_real_node(env: &Env) {
    let node = build_node(env, "node");
    let c = container(env, "c");
    attach(&node.proc_root.join("driver"), &c.at("/proc/driver")); // now it looks like a node with a driver
    let kept = [BUS[0], BUS[2]];
    let mut real = procsource::source_for(None);
    assert_eq!(run(&c, &mut real, &kept, &[], false), Ok("created"));
    assert_eq!(run(&c, &mut real, &kept, &[], false), Ok("kept"));
    let view = mounts_at(&c.mount_point("/proc/driver/nvidia"));
    assert_eq!(view.len(), 1);
    assert_eq!(view[0].source, "nri-gpu");
    assert_locked(&view[0]);
    assert_eq!(names(&c.at("/proc/driver")), ["nvidia", "nvidia-caps"]); // the view covers driver/nvidia only
    assert_eq!(names(&c.at("/proc/driver/nvidia")), [MARKER, "gpus", "params", "registry", "version"]);
    assert_eq!(names(&c.at("/proc/driver/nvidia/gpus")), kept);
    let params = fs::read_to_string(c.at("/proc/driver/nvidia/params")).unwrap();
    assert!(params.lines().any(|l| l == "ModifyDeviceFiles: 0"));
    let marker = String::from_utf8(fs::read(c.at("/proc/driver/nvidia").join(MARKER)).unwrap()).unwrap();
    assert_eq!(marker.lines().nth(1), Some("source: container"));
    // With MIG caps, from the container's own tree.
    let caps: Vec<String> = device_caps(2, 0).into_iter().chain(["mig/monitor".to_string()]).collect();
    assert_eq!(run(&c, &mut real, &[BUS[2]], &caps, false), Ok("created"));
    assert_eq!(run(&c, &mut real, &[BUS[2]], &caps, false), Ok("kept"));
    assert_eq!(mounts_at(&c.mount_point("/proc/driver/nvidia")).len(), 1);
    assert_eq!(listing(&c.at("/proc/driver/nvidia/capabilities"), &c.path), expected(&caps));
    // A view from another source is replaced, over the same tree.
    assert_eq!(run(&c, &mut node.source(), &[BUS[2]], &caps, false), Ok("created"));
    assert_eq!(mounts_at(&c.mount_point("/proc/driver/nvidia")).len(), 1);
    assert_eq!(mounts_at(&c.mount_point("/proc/driver")).len(), 1); // the attached node tree alone
}

fn a_real_node_without_a_driver_tree(env: &Env) {
    let c = container(env, "c");
    let mut real = procsource::source_for(None);
    assert_eq!(run(&c, &mut real, &[], &[], false), Ok("skipped"));
    assert_eq!(
        run(&c, &mut real, &[BUS[0]], &[], false),
        Err("/proc/driver/nvidia: not in the container (is the NVIDIA driver loaded?)".to_string())
    );
    assert!(mounts_under(&c.mount_point("/proc/driver")).is_empty());
}

/// Each file and GPU folder is opened without following a link (a FIFO would
/// block a plain read); a simulated node's tree is a real directory, with real links.
fn a_host_directorys_links_and_fifos_are_refused(env: &Env) {
    let c = container(env, "c");
    let refused = "refused: its resolution meets a link not followed here (a symlink, a /proc magic link or a loop)";
    let take = |node: &Node, bus: &[&str]| run(&c, &mut node.source(), bus, &[], false).unwrap_err();

    let node = build_node(env, "n1");
    fs::create_dir(env.dir.join("elsewhere")).unwrap();
    let gpu = node.nvidia().join("gpus").join(BUS[0]);
    fs::rename(&gpu, env.dir.join("elsewhere/gpu")).unwrap();
    symlink("../../../../../elsewhere/gpu", &gpu).unwrap();
    assert_eq!(take(&node, &[BUS[0]]), format!("driver/nvidia/gpus/{}: {}", BUS[0], refused));

    let node = build_node(env, "n2");
    fs::rename(node.nvidia().join("gpus"), env.dir.join("n2/gpus")).unwrap();
    symlink("../../../gpus", node.nvidia().join("gpus")).unwrap();
    assert_eq!(take(&node, &[BUS[1]]), format!("driver/nvidia/gpus/{}: {}", BUS[1], refused));

    let node = build_node(env, "n3");
    fs::remove_file(node.nvidia().join("params")).unwrap();
    symlink("/etc/shadow", node.nvidia().join("params")).unwrap();
    assert_eq!(take(&node, &[]), format!("driver/nvidia/params: {}", refused));

    let node = build_node(env, "n4");
    fs::remove_file(node.nvidia().join("version")).unwrap();
    make_fifo(&node.nvidia().join("version"));
    assert_eq!(take(&node, &[]), "driver/nvidia/version: not a regular file");

    let node = build_node(env, "n5");
    fs::remove_file(node.nvidia().join("registry")).unwrap();
    fs::create_dir(node.nvidia().join("registry")).unwrap();
    assert_eq!(take(&node, &[]), "driver/nvidia/registry: not a regular file");

    let node = build_node(env, "n6");
    fs::write(node.nvidia().join("params"), vec![b'x'; (1 << 20) + 1]).unwrap();
    assert_eq!(take(&node, &[]), "driver/nvidia/params: 1048577 bytes, over the limit of 1048576 bytes");

    let node = build_node(env, "n7"); // a GPU folder that is a file
    fs::remove_dir_all(node.nvidia().join("gpus").join(BUS[3])).unwrap();
    fs::write(node.nvidia().join("gpus").join(BUS[3]), "").unwrap();
    assert_eq!(take(&node, &[BUS[3]]), format!("bus id {} is not on this node", BUS[3]));

    let node = build_node(env, "n8"); // missing files are left out, not refused
    fs::remove_file(node.nvidia().join("registry")).unwrap();
    created(&c, &node, &[BUS[0]], &[], false);
    assert_eq!(names(&c.at("/proc/driver/nvidia")), ["gpus", "params", "version"]);
    assert_eq!(mounts_at(&c.mount_point("/proc/driver")).len(), 1);
}

/// On a real node the source is the container's own tree: a link planted there
/// (the driver makes none) is refused the same way, and nothing is left mounted.
fn a_containers_own_planted_link_is_refused(env: &Env) {
    let node = build_node(env, "node");
    let gpu = node.nvidia().join("gpus").join(BUS[2]);
    fs::remove_dir_all(&gpu).unwrap();
    symlink(BUS[0], &gpu).unwrap();
    let c = container(env, "c");
    attach(&node.proc_root.join("driver"), &c.at("/proc/driver"));
    let error = run(&c, &mut procsource::source_for(None), &[BUS[2]], &[], false).unwrap_err();
    assert!(
        error.starts_with(&format!("driver/nvidia/gpus/{}: refused: its resolution meets a link", BUS[2])),
        "{}",
        error
    );
    assert!(mounts_under(&c.mount_point("/proc/driver/nvidia")).is_empty());
}

// ---------------------------------------------------------------- test_start_mig.py

fn a_mig_device_sees_exactly_its_two_access_files(env: &Env) {
    let node = build_node(env, "node");
    let c = container(env, "c");
    let caps = device_caps(2, 0);
    created(&c, &node, &[BUS[2]], &caps, false);
    assert_eq!(listing(&c.at("/proc/driver/nvidia/capabilities"), &c.path), expected(&caps));
    assert_eq!(names(&c.at("/proc/driver/nvidia/gpus")), [BUS[2]]);
    assert_eq!(
        fs::read(c.at("/proc/driver/nvidia/capabilities").join(&caps[1])).unwrap(),
        fs::read(node.caps().join(&caps[1])).unwrap()
    );
    let marker = String::from_utf8(fs::read(c.at("/proc/driver").join(MARKER)).unwrap()).unwrap();
    assert_eq!(marker.lines().last(), Some("capabilities: gpu2/mig/gi2/access gpu2/mig/gi2/ci0/access"));
}

fn the_cap_files_are_locked_binds(env: &Env) {
    let node = build_node(env, "node");
    let c = container(env, "c");
    let caps = device_caps(2, 0);
    created(&c, &node, &[BUS[2]], &caps, false);
    let root = c.mount_point("/proc/driver/nvidia/capabilities");
    let binds = mounts_under(&root);
    let mut points: Vec<String> = binds.iter().map(|m| m.point.clone()).collect();
    points.sort();
    assert_eq!(points, caps.iter().map(|cap| format!("{}/{}", root, cap)).collect::<Vec<_>>());
    binds.iter().for_each(assert_locked);
    assert_eq!(write_error(&c.at("/proc/driver/nvidia/capabilities").join(&caps[0])), Some(sys::EROFS));
    assert_eq!(write_error(&c.at("/proc/driver/nvidia/capabilities/x")), Some(sys::EROFS));
}

fn monitor_and_config_are_shown_when_granted(env: &Env) {
    let node = build_node(env, "node");
    let c = container(env, "c");
    let caps: Vec<String> = device_caps(3, 0).into_iter().chain(["mig/monitor".to_string()]).collect();
    created(&c, &node, &[BUS[2]], &caps, false);
    assert_eq!(listing(&c.at("/proc/driver/nvidia/capabilities"), &c.path), expected(&caps));
    let d = container(env, "d");
    let caps = vec!["mig/config".to_string(), "mig/monitor".to_string()];
    created(&d, &node, &[BUS[2]], &caps, false);
    assert_eq!(listing(&d.at("/proc/driver/nvidia/capabilities"), &d.path), expected(&caps));
}

fn no_caps_no_capabilities_folder(env: &Env) {
    let node = build_node(env, "node");
    let c = container(env, "c");
    created(&c, &node, &[BUS[2]], &[], false);
    let found = fs::symlink_metadata(c.at("/proc/driver/nvidia/capabilities"));
    assert_eq!(found.err().map(|e| e.kind()), Some(ErrorKind::NotFound));
}

fn all_caps_show_the_whole_folder_live(env: &Env) {
    let node = build_node(env, "node");
    let c = container(env, "c");
    let caps: Vec<String> = device_caps(2, 0).into_iter().chain(["mig/config".to_string()]).collect();
    created(&c, &node, &[BUS[2]], &caps, true);
    let root = c.mount_point("/proc/driver/nvidia/capabilities");
    let binds = mounts_under(&root);
    assert_eq!(binds.iter().map(|m| m.point.clone()).collect::<Vec<_>>(), vec![root]);
    assert_locked(&binds[0]);
    let view = c.at("/proc/driver/nvidia/capabilities");
    assert!(view.join("fabric-imex-mgmt").is_file()); // the whole folder, as libnvidia-container binds it
                                                      // Created after the start (an operator's nvidia-smi mig -cgi): the container sees it too.
    write(&node.caps().join("gpu2/mig/gi9/ci0/access"), &access_file(cap_minor(9, Some(0))), 0o444);
    let strip = |lines: Vec<String>, base: &str| -> Vec<String> {
        lines.into_iter().map(|l| l.replacen(base, "", 1)).collect()
    };
    let host = strip(listing(&node.caps(), &node.proc_root), "/driver/nvidia/capabilities");
    let seen = strip(listing(&view, &c.path), "/proc/driver/nvidia/capabilities");
    assert_eq!(seen, host);
    assert!(seen.iter().any(|l| l.ends_with(" /gpu2/mig/gi9/ci0/access")));
    let marker = String::from_utf8(fs::read(c.at("/proc/driver").join(MARKER)).unwrap()).unwrap();
    assert_eq!(marker.lines().last(), Some("capabilities: all"));
}

fn the_same_caps_keep_the_view_others_replace_it(env: &Env) {
    let node = build_node(env, "node");
    let c = container(env, "c");
    let caps = device_caps(2, 0);
    let other = device_caps(3, 0);
    let reversed: Vec<String> = caps.iter().rev().cloned().collect();
    let runs: [(&[String], bool, &str); 8] = [
        (&caps, false, "created"),
        (&caps, false, "kept"),
        (&reversed, false, "kept"), // the same set
        (&other, false, "created"),
        (&other, true, "created"),
        (&other, true, "kept"),
        (&[], false, "created"),
        (&caps, false, "created"),
    ];
    for (caps, all, want) in runs.iter() {
        assert_eq!(run(&c, &mut node.source(), &[BUS[2]], caps, *all), Ok(*want), "{:?} all={}", caps, all);
    }
    assert_eq!(mounts_at(&c.mount_point("/proc/driver")).len(), 1);
    assert_eq!(listing(&c.at("/proc/driver/nvidia/capabilities"), &c.path), expected(&caps));
}

fn a_cap_missing_at_start_is_named(env: &Env) {
    let node = build_node(env, "node");
    let gone = "gpu2/mig/gi9/access".to_string(); // no such instance: destroyed since planning
    for all in [false, true] {
        let c = container(env, if all { "c-all" } else { "c" });
        let error = run(&c, &mut node.source(), &[BUS[2]], std::slice::from_ref(&gone), all).unwrap_err();
        assert_eq!(
            error,
            format!(
                "driver/nvidia/capabilities/{} is not on this node (a MIG instance destroyed since the container was planned?)",
                gone
            )
        );
        assert!(mounts_under(&c.mount_point("/proc/driver")).is_empty());
    }
}

fn a_cap_symlink_or_non_file_is_refused(env: &Env) {
    let c = container(env, "c");
    let node = build_node(env, "n1");
    let caps = device_caps(2, 0);
    let access = node.caps().join(&caps[1]);
    fs::remove_file(&access).unwrap();
    symlink("/etc/shadow", &access).unwrap();
    let error = run(&c, &mut node.source(), &[BUS[2]], &caps, false).unwrap_err();
    assert!(error.ends_with("ci0/access: refused: its resolution meets a link not followed here (a symlink, a /proc magic link or a loop)"), "{}", error);

    let node = build_node(env, "n2");
    let mig = node.caps().join("gpu2/mig");
    fs::rename(mig.join("gi3"), mig.join("gi3-real")).unwrap();
    symlink("gi3-real", mig.join("gi3")).unwrap();
    let error = run(&c, &mut node.source(), &[BUS[2]], &device_caps(3, 0), false).unwrap_err();
    assert!(error.starts_with("driver/nvidia/capabilities/gpu2/mig/gi3/access: refused"), "{}", error);

    let node = build_node(env, "n3");
    let access = node.caps().join(&caps[0]);
    fs::remove_file(&access).unwrap();
    fs::create_dir(&access).unwrap();
    let error = run(&c, &mut node.source(), &[BUS[2]], &caps, false).unwrap_err();
    assert_eq!(error, "driver/nvidia/capabilities/gpu2/mig/gi2/access: not a regular file");

    let node = build_node(env, "n4");
    let access = node.caps().join(&caps[0]);
    fs::remove_file(&access).unwrap();
    make_fifo(&access);
    let error = run(&c, &mut node.source(), &[BUS[2]], &caps, true).unwrap_err();
    assert_eq!(error, "driver/nvidia/capabilities/gpu2/mig/gi2/access: not a regular file");

    let node = build_node(env, "n5"); // the whole folder a link: refused for caps_all too
    fs::rename(node.caps(), env.dir.join("n5/caps")).unwrap();
    symlink("../../../caps", node.caps()).unwrap();
    let error = run(&c, &mut node.source(), &[BUS[2]], &[], true).unwrap_err();
    assert!(error.starts_with("driver/nvidia/capabilities: refused: its resolution meets a link"), "{}", error);
    assert!(mounts_under(&c.mount_point("/proc/driver")).is_empty());
}

fn a_cap_name_not_the_drivers_is_refused(env: &Env) {
    let node = build_node(env, "node");
    let c = container(env, "c");
    for (cap, shown) in [
        ("../../../../etc/shadow", "'../../../../etc/shadow'"),
        ("gpu2/mig/gi2/../../x/access", "'gpu2/mig/gi2/../../x/access'"),
    ] {
        let error = run(&c, &mut node.source(), &[BUS[2]], &[cap.to_string()], false).unwrap_err();
        assert_eq!(error, format!("proc cap {}: not a capability file the driver makes", shown));
    }
    assert!(mounts_under(&c.mount_point("/proc/driver")).is_empty());
}

// ---------------------------------------------------------------- failure

/// A bind that fails once the view is attached (a source whose second GPU "clone"
/// is a plain directory fd, not a detached mount: move_mount says EINVAL): the view
/// is unmounted again, the first GPU's bind with it, and the error names the place.
fn a_failure_after_attaching_leaves_no_view(env: &Env) {
    let node = build_node(env, "node");
    let tree = sys::openat_fd(sys::AT_FDCWD, path_str(&node.nvidia()), sys::O_PATH | sys::O_DIRECTORY, 0).unwrap();
    let bus: Vec<String> = BUS[..1].iter().map(|b| b.to_string()).collect();
    let mut taken = procsource::take(tree.as_raw_fd(), &bus, &[], false).expect("take");
    let plain =
        sys::openat_fd(tree.as_raw_fd(), &format!("gpus/{}", BUS[1]), sys::O_PATH | sys::O_DIRECTORY, 0).unwrap();
    taken.gpus.push((BUS[1].to_string(), plain));
    let mut source = procsource::host_directory_taken(path_str(&node.nvidia()), taken);
    let c = container(env, "c");
    let files = c.root.detached_copy().unwrap();
    let both: Vec<String> = BUS[..2].iter().map(|b| b.to_string()).collect();
    let error = procview::isolate(&c.root, &both, &mut source, &files, &[], false).unwrap_err();
    assert_eq!(error.0, "/proc/driver: Invalid argument");
    assert!(mounts_under(&c.mount_point("/proc/driver")).is_empty());
    assert!(names(&c.at("/proc/driver")).is_empty()); // the container's own (empty) procfs folder again
                                                      // The cwd went back to the root after the unmount.
    assert_eq!(fs::canonicalize(".").unwrap(), c.path);
}

// ---------------------------------------------------------------- small helpers

/// Every folder under (and at) `dir` gets `mode` (the kernel's 0555 folders).
fn chmod_folders(dir: &Path, mode: u32) {
    for name in names(dir) {
        let path = dir.join(name);
        if fs::symlink_metadata(&path).unwrap().is_dir() {
            chmod_folders(&path, mode);
        }
    }
    fs::set_permissions(dir, fs::Permissions::from_mode(mode)).expect("chmod");
}

fn make_fifo(path: &Path) {
    let name = cstr(path);
    // SAFETY: a NUL-terminated path that outlives the call.
    assert_eq!(unsafe { mkfifo(name.as_ptr(), 0o644) }, 0, "mkfifo: {}", std::io::Error::last_os_error());
}
