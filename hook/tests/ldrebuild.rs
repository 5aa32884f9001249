//! The `rebuild` ld.so.cache mode (`ldrebuild`) on a fake container root, as
//! tests/integration/test_start.py holds the Python's on runc containers: the
//! host's static ldconfig rebuilds the cache of a root made of a few host
//! libraries, and static probes compiled here stand in for ldconfig to report
//! how it runs (confined, in namespaces of its own), to fail, to crash and to hang.
//!
//! `harness = false`: the mounts need a private mount namespace, and
//! `unshare(CLONE_NEWNS)` is refused in a multi-threaded process such as
//! libtest's runner. Needs root; skipped with a message otherwise. The probe
//! cases need `gcc` with a static libc: skipped with a message without one.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::os::raw::{c_char, c_int, c_ulong};
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::os::unix::io::{FromRawFd, IntoRawFd};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{cstr, path_str, write, Outcome};
use nri_gpu_hook::ldrebuild::{self, Trusted};
use nri_gpu_hook::model::LdCacheEntry;
use nri_gpu_hook::rootdir::RootDir;

extern "C" {
    fn chown(path: *const c_char, uid: u32, gid: u32) -> c_int;
    fn fork() -> c_int;
    fn pipe(fds: *mut c_int) -> c_int;
    fn dup2(old: c_int, new: c_int) -> c_int;
    fn waitpid(pid: c_int, status: *mut c_int, options: c_int) -> c_int;
    fn _exit(status: c_int) -> !;
}

const MS_BIND: c_ulong = 0x1000;
const MS_REC: c_ulong = 0x4000;
const LDCONFIG: &str = "/sbin/ldconfig";
const ARGV: &str = "ldconfig,-X,-i,-f,/etc/ld.so.conf,-C,/proc/ld.so.cache";

/// The probe both implementations of the confined ldconfig run (test_start.py too).
const PROBE_C: &str = include_str!("fixtures/ldconfig-probe.c");
const FAILING_C: &str =
    "#include <stdio.h>\nint main(void) { fprintf(stderr, \"ldconfig: something broke\\n\"); return 3; }\n";
const CRASHING_C: &str = "#include <stdio.h>\nint main(void) { puts(\"about to crash\"); fflush(stdout); \
                          *(volatile int *)0 = 1; return 0; }\n";
const SLEEPER_C: &str = "#include <unistd.h>\nint main(void) { for (;;) pause(); }\n";

fn main() {
    let scratch = match common::Scratch::enter("ldrebuild", "a private mount namespace, mounts, a change of uid") {
        Some(scratch) => scratch,
        None => return,
    };
    let base = scratch.base.clone();

    let probes = compile_probes(&base.join("probes"));
    let tests: Vec<(&str, Test)> = vec![
        ("the_rebuilt_cache_lists_the_images_libraries", the_rebuilt_cache_lists_the_images_libraries),
        ("nothing_but_the_cache_is_written", nothing_but_the_cache_is_written),
        ("cache_lists_reads_the_installed_cache", cache_lists_reads_the_installed_cache),
        ("the_procfs_mounts_are_those_under_the_root", the_procfs_mounts_are_those_under_the_root),
        ("a_dynamic_ldconfig_is_refused", a_dynamic_ldconfig_is_refused),
        ("an_ldconfig_anyone_but_root_may_change_is_refused", an_ldconfig_anyone_but_root_may_change_is_refused),
        (
            "a_missing_or_oversized_or_non_elf_ldconfig_is_refused",
            a_missing_or_oversized_or_non_elf_ldconfig_is_refused,
        ),
        ("a_root_without_proc_fails_before_running_ldconfig", a_root_without_proc_fails_before_running_ldconfig),
        ("ldconfig_runs_confined", ldconfig_runs_confined),
        ("a_failing_ldconfig_is_reported_with_its_output", a_failing_ldconfig_is_reported_with_its_output),
        ("a_crashing_ldconfig_is_reported_with_its_signal", a_crashing_ldconfig_is_reported_with_its_signal),
        ("a_hanging_ldconfig_is_killed_at_the_deadline", a_hanging_ldconfig_is_killed_at_the_deadline),
        ("ldconfig_runs_in_namespaces_of_its_own", ldconfig_runs_in_namespaces_of_its_own),
        ("close_fds_except_keeps_exactly_what_it_is_told", close_fds_except_keeps_exactly_what_it_is_told),
    ];
    let static_ldconfig = is_static(LDCONFIG);
    let summary = common::run_cases("ldrebuild", &base, &tests, |dir| Env {
        dir,
        probes: probes.clone(),
        static_ldconfig: static_ldconfig.clone(),
    });
    scratch.leave();
    summary.finish();
}

type Test = fn(&Env) -> Outcome;

struct Env {
    dir: PathBuf,
    probes: Result<Probes, String>,
    static_ldconfig: Result<(), String>,
}

#[derive(Clone)]
struct Probes {
    probe: PathBuf,
    failing: PathBuf,
    crashing: PathBuf,
    sleeper: PathBuf,
}

fn is_static(path: &str) -> Result<(), String> {
    match Command::new("file").arg("-L").arg(path).output() {
        Ok(out)
            if String::from_utf8_lossy(&out.stdout).contains("statically linked")
                || String::from_utf8_lossy(&out.stdout).contains("static-pie linked") =>
        {
            Ok(())
        }
        Ok(out) => Err(format!("{} is not static: {}", path, String::from_utf8_lossy(&out.stdout).trim())),
        Err(_) if Path::new(path).exists() => Ok(()), // no `file`: let the hook's own check decide
        Err(e) => Err(format!("{}: {}", path, e)),
    }
}

/// The static probes, compiled once (`gcc -static`); why not, when they cannot be.
fn compile_probes(dir: &Path) -> Result<Probes, String> {
    fs::create_dir(dir).expect("probe directory");
    let build = |name: &str, source: &str| -> Result<PathBuf, String> {
        let c = dir.join(format!("{}.c", name));
        fs::write(&c, source).expect("probe source");
        let out = dir.join(name);
        let made = Command::new("gcc").args(["-static", "-O", "-o"]).arg(&out).arg(&c).output();
        match made {
            Ok(made) if made.status.success() => Ok(out),
            Ok(made) => Err(format!("gcc -static failed: {}", String::from_utf8_lossy(&made.stderr).trim())),
            Err(e) => Err(format!("no gcc: {}", e)),
        }
    };
    Ok(Probes {
        probe: build("probe", PROBE_C)?,
        failing: build("failing", FAILING_C)?,
        crashing: build("crashing", CRASHING_C)?,
        sleeper: build("sleeper", SLEEPER_C)?,
    })
}

// ---------------------------------------------------------------- the container

/// A host library's real file (followed from its SONAME in the usual folders).
fn host_libz() -> PathBuf {
    for dir in ["/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu", "/usr/lib64", "/lib64"]
    {
        if let Ok(real) = fs::canonicalize(Path::new(dir).join("libz.so.1")) {
            return real;
        }
    }
    panic!("no libz.so.1 on the host");
}

/// A container root under `env.dir`, a mount of its own (as runc's bind of the
/// bundle's rootfs onto itself): an `ld.so.conf` including `ld.so.conf.d`, which
/// names `/opt/lib` (libz and its SONAME link, as an image has them); a second
/// libz in the multiarch folder without its SONAME link (ldconfig `-X` makes
/// none); an image cache that is garbage; the host's `/proc` (with its
/// submounts) at `/proc` and again at `/srv/proc`.
fn container(env: &Env, with_proc: bool) -> PathBuf {
    let root = env.dir.join("root");
    let libz = host_libz();
    let data = fs::read(&libz).expect("read libz");
    let name = libz.file_name().and_then(|n| n.to_str()).expect("libz's name").to_string();
    write(&root.join("etc/ld.so.conf"), b"include /etc/ld.so.conf.d/*.conf\n", 0o644);
    write(&root.join("etc/ld.so.conf.d/opt.conf"), b"/opt/lib\n", 0o644);
    write(&root.join("etc/ld.so.cache"), b"an old cache of the image's\n", 0o644);
    write(&root.join("opt/lib").join(&name), &data, 0o644);
    symlink(&name, root.join("opt/lib/libz.so.1")).expect("soname link");
    write(&root.join("usr/lib/x86_64-linux-gnu/libz.so.1.2.99"), &data, 0o644);
    fs::create_dir_all(root.join("var/cache/ldconfig")).expect("mkdir");
    fs::create_dir_all(root.join("tmp")).expect("mkdir");
    fs::set_permissions(root.join("tmp"), fs::Permissions::from_mode(0o1777)).expect("chmod");
    bind(&root, &root, 0);
    if with_proc {
        for point in ["proc", "srv/proc"] {
            fs::create_dir_all(root.join(point)).expect("mkdir");
            bind(Path::new("/proc"), &root.join(point), MS_REC);
        }
    }
    root
}

fn bind(source: &Path, target: &Path, flags: c_ulong) {
    common::mount_at(path_str(source), target, None, MS_BIND | flags);
}

fn open_root(root: &Path) -> RootDir {
    RootDir::open_path(path_str(root)).expect("open the root")
}

fn trusted(root: &Path, ldconfig: &Path) -> Result<Trusted, String> {
    ldrebuild::trusted_here(&open_root(root), path_str(root), path_str(ldconfig)).map_err(|e| e.0)
}

/// Rebuild `root`'s cache with `ldconfig` (the deadline `seconds` away).
fn rebuild(root: &Path, ldconfig: &Path, seconds: f64) -> Result<(), String> {
    let live = open_root(root);
    let trusted = ldrebuild::trusted_here(&live, path_str(root), path_str(ldconfig)).map_err(|e| e.0)?;
    let copy = live.detached_copy().expect("the root's copy");
    ldrebuild::run(&copy, &trusted, Instant::now() + Duration::from_secs_f64(seconds)).map_err(|e| e.0)
}

/// `ldconfig -p` of the cache at `path`.
fn listed(path: &Path) -> String {
    let out = Command::new(LDCONFIG).arg("-p").arg("-C").arg(path).output().expect("ldconfig -p");
    assert!(out.status.success(), "ldconfig -p: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every file, link and folder under `root` on its own mount (procfs mounts left
/// out): kind, mode, owner, size, link target, and for files and links their
/// inode and mtime (a folder's change as its entries change).
fn snapshot(root: &Path) -> BTreeMap<String, String> {
    let mut found = BTreeMap::new();
    let dev = fs::symlink_metadata(root).expect("stat root").dev();
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for entry in fs::read_dir(&dir).expect("read_dir") {
            let path = entry.expect("entry").path();
            let meta = fs::symlink_metadata(&path).expect("lstat");
            let name = path.strip_prefix(root).expect("under root").to_string_lossy().into_owned();
            let mut said = format!("{:o} {}:{} {}", meta.mode(), meta.uid(), meta.gid(), meta.len());
            if meta.file_type().is_symlink() {
                said += &format!(" -> {:?}", fs::read_link(&path).expect("readlink"));
            }
            if !meta.is_dir() {
                said += &format!(" ino {} mtime {}.{}", meta.ino(), meta.mtime(), meta.mtime_nsec());
            } else if meta.dev() == dev {
                todo.push(path);
            }
            found.insert(name, said);
        }
    }
    found
}

fn require(env: &Env) -> Result<&Probes, Outcome> {
    env.static_ldconfig.as_ref().map_err(|why| Outcome::Skipped(why.clone()))?;
    env.probes.as_ref().map_err(|why| Outcome::Skipped(why.clone()))
}

macro_rules! needs {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(outcome) => return outcome,
        }
    };
}

fn needs_ldconfig(env: &Env) -> Result<(), Outcome> {
    env.static_ldconfig.as_ref().map(|_| ()).map_err(|why| Outcome::Skipped(why.clone()))
}

// ---------------------------------------------------------------- the cases

fn the_rebuilt_cache_lists_the_images_libraries(env: &Env) -> Outcome {
    needs!(needs_ldconfig(env));
    let root = container(env, true);
    rebuild(&root, Path::new(LDCONFIG), 30.0).expect("rebuild");
    let text = listed(&root.join("etc/ld.so.cache"));
    let line =
        text.lines().find(|l| l.trim_start().starts_with("libz.so.1 (libc6,")).unwrap_or_else(|| panic!("{}", text));
    assert!(line.ends_with(" => /opt/lib/libz.so.1"), "{}", text);
    let info = fs::symlink_metadata(root.join("etc/ld.so.cache")).expect("the cache");
    assert!(info.is_file() && info.mode() & 0o7777 == 0o644 && info.uid() == 0, "{:o}", info.mode());
    // The container's own mounts are as they were: its /proc not covered, its root writable.
    assert!(root.join("proc/self/status").exists());
    fs::write(root.join("tmp/after"), b"x").expect("the root stays writable");
    Outcome::Ran
}

fn nothing_but_the_cache_is_written(env: &Env) -> Outcome {
    needs!(needs_ldconfig(env));
    let root = container(env, true);
    let before = snapshot(&root);
    rebuild(&root, Path::new(LDCONFIG), 30.0).expect("rebuild");
    let mut after = snapshot(&root);
    let (old, new) = (before.get("etc/ld.so.cache").cloned(), after.get("etc/ld.so.cache").cloned());
    assert_ne!(old, new, "the cache was replaced");
    let mut before = before;
    before.remove("etc/ld.so.cache");
    after.remove("etc/ld.so.cache");
    // No SONAME link for the multiarch libz (-X), no aux cache, no temporary left.
    assert_eq!(before, after);
    Outcome::Ran
}

fn cache_lists_reads_the_installed_cache(env: &Env) -> Outcome {
    needs!(needs_ldconfig(env));
    let root = container(env, true);
    let entry = |path: &str| LdCacheEntry {
        name: "libz.so.1".into(),
        path: path.into(),
        flags: 0x303,
        is_64bit: true,
        hwcap: 0,
        osversion: 0,
    };
    let copy = open_root(&root).detached_copy().expect("copy");
    let ours = [entry("/opt/lib/libz.so.1")];
    assert!(!ldrebuild::cache_lists(&copy, &ours, None), "the image's garbage cache lists nothing");
    rebuild(&root, Path::new(LDCONFIG), 30.0).expect("rebuild");
    assert!(ldrebuild::cache_lists(&copy, &ours, None));
    assert!(ldrebuild::cache_lists(&copy, &ours, Some(Instant::now() + Duration::from_secs(5))));
    assert!(!ldrebuild::cache_lists(&copy, &[entry("/opt/lib/libz.so.1"), entry("/opt/lib/libnone.so.1")], None));
    assert!(!ldrebuild::cache_lists(&copy, &[], None), "no entries: nothing to go by");
    fs::remove_file(root.join("etc/ld.so.cache")).expect("rm");
    assert!(!ldrebuild::cache_lists(&copy, &ours, None));
    Outcome::Ran
}

fn the_procfs_mounts_are_those_under_the_root(env: &Env) -> Outcome {
    needs!(needs_ldconfig(env));
    let root = container(env, true);
    let found = trusted(&root, Path::new(LDCONFIG)).expect("trusted");
    // The host's /proc is not under the root; the submounts of a bound /proc are
    // covered with it.
    assert_eq!(found.proc_mounts, vec!["/proc".to_string(), "/srv/proc".to_string()]);
    assert_eq!(found.path, LDCONFIG);
    // A path with a trailing slash and one through a link name the same root.
    let slashed = format!("{}/", path_str(&root));
    let again = ldrebuild::trusted_here(&open_root(&root), &slashed, LDCONFIG).expect("trusted");
    assert_eq!(again.proc_mounts, found.proc_mounts);
    let link = env.dir.join("link");
    symlink(&root, &link).expect("link");
    let again = ldrebuild::trusted_here(&open_root(&root), path_str(&link), LDCONFIG).expect("trusted");
    assert_eq!(again.proc_mounts, found.proc_mounts);
    Outcome::Ran
}

fn a_dynamic_ldconfig_is_refused(env: &Env) -> Outcome {
    let root = container(env, false);
    let dynamic = fs::canonicalize("/usr/bin/true").expect("true");
    let err = trusted(&root, &dynamic).expect_err("refused");
    let expected = format!(
        "{} is dynamically linked (interpreter /lib64/ld-linux-x86-64.so.2): inside the container it would be \
         loaded by the image's own loader; configure a statically linked ldconfig",
        path_str(&dynamic)
    );
    if cfg!(target_arch = "x86_64") {
        assert_eq!(err, expected);
    } else {
        assert!(err.contains(" is dynamically linked (interpreter /lib/ld-linux"), "{}", err);
    }
    Outcome::Ran
}

fn an_ldconfig_anyone_but_root_may_change_is_refused(env: &Env) -> Outcome {
    needs!(needs_ldconfig(env));
    let root = container(env, false);
    let copy = env.dir.join("ldconfig");
    fs::copy(LDCONFIG, &copy).expect("copy ldconfig");
    let name = path_str(&copy).to_string();
    let refused = format!("{}: must be owned by root and writable by root only", name);
    for mode in [0o775, 0o757, 0o777] {
        fs::set_permissions(&copy, fs::Permissions::from_mode(mode)).expect("chmod");
        assert_eq!(trusted(&root, &copy).err().as_deref(), Some(refused.as_str()), "{:o}", mode);
    }
    fs::set_permissions(&copy, fs::Permissions::from_mode(0o755)).expect("chmod");
    let c = cstr(&copy);
    // SAFETY: a NUL-terminated path of ours.
    assert_eq!(unsafe { chown(c.as_ptr(), 1000, 0) }, 0);
    assert_eq!(trusted(&root, &copy).err().as_deref(), Some(refused.as_str()));
    // SAFETY: as above.
    assert_eq!(unsafe { chown(c.as_ptr(), 0, 0) }, 0);
    fs::set_permissions(&copy, fs::Permissions::from_mode(0o644)).expect("chmod");
    assert_eq!(trusted(&root, &copy).err(), Some(format!("{}: not an executable file", name)));
    fs::set_permissions(&copy, fs::Permissions::from_mode(0o700)).expect("chmod");
    trusted(&root, &copy).expect("root's own, executable: accepted");
    Outcome::Ran
}

fn a_missing_or_oversized_or_non_elf_ldconfig_is_refused(env: &Env) -> Outcome {
    let root = container(env, false);
    let missing = env.dir.join("none");
    assert_eq!(trusted(&root, &missing).err(), Some(format!("{}: No such file or directory", path_str(&missing))));
    assert_eq!(trusted(&root, &env.dir).err(), Some(format!("{}: not an executable file", path_str(&env.dir))));
    let big = env.dir.join("big");
    fs::File::create(&big).and_then(|f| f.set_len((64 << 20) + 1)).expect("a sparse file");
    fs::set_permissions(&big, fs::Permissions::from_mode(0o755)).expect("chmod");
    assert_eq!(
        trusted(&root, &big).err(),
        Some(format!("{}: 67108865 bytes, over the limit of 67108864 bytes for ldconfig", path_str(&big)))
    );
    let script = env.dir.join("script");
    write(&script, b"#!/bin/sh\nexit 0\n", 0o755);
    assert_eq!(trusted(&root, &script).err(), Some(format!("{}: not an ELF file", path_str(&script))));
    Outcome::Ran
}

fn a_root_without_proc_fails_before_running_ldconfig(env: &Env) -> Outcome {
    needs!(needs_ldconfig(env));
    let root = container(env, false);
    let err = rebuild(&root, Path::new(LDCONFIG), 30.0).expect_err("no /proc to attach the output over");
    assert_eq!(
        err,
        format!(
            "{} exited with status 127: nri-gpu: before running ldconfig: \
             [Errno 2] /proc: openat2('/proc'): No such file or directory",
            LDCONFIG
        )
    );
    assert_eq!(fs::read(root.join("etc/ld.so.cache")).expect("cache"), b"an old cache of the image's\n");
    Outcome::Ran
}

fn ldconfig_runs_confined(env: &Env) -> Outcome {
    let probes = needs!(require(env));
    let root = container(env, true);
    let err = rebuild(&root, &probes.probe, 30.0).expect_err("the probe fails, its report the message");
    let prefix = format!("{} exited with status 1: ", path_str(&probes.probe));
    let said = err.strip_prefix(&prefix).unwrap_or_else(|| panic!("{}", err));
    let report: BTreeMap<&str, &str> = said.split_whitespace().filter_map(|item| item.split_once('=')).collect();
    let get = |key: &str| report.get(key).copied().unwrap_or_else(|| panic!("{} in {}", key, said));
    assert_eq!(get("argv"), ARGV);
    assert_eq!((get("uid"), get("gid"), get("groups")), ("65534", "65534", "0")); // nobody
    assert_eq!(get("env"), "0"); // no environment at all
    assert_eq!((get("pid"), get("ppid")), ("1", "0")); // pid 1 of a pid namespace of its own
    assert_eq!(get("dumpable"), "0"); // not even after the exec
    assert_eq!((get("caps"), get("nnp")), ("0:0", "1"));
    assert_eq!((get("cpu"), get("fsize")), ("10", "67108864"));
    assert_eq!(get("proc"), "0"); // /proc is the empty output tmpfs
    assert_eq!(get("srvproc"), "0"); // every other procfs mount covered
    assert_eq!((get("cwd"), get("open")), ("/", "0"));
    assert_eq!(get("writable"), "0"); // a read-only view, even of a 1777 folder
    Outcome::Ran
}

fn a_failing_ldconfig_is_reported_with_its_output(env: &Env) -> Outcome {
    let probes = needs!(require(env));
    let root = container(env, true);
    let err = rebuild(&root, &probes.failing, 30.0).expect_err("fails");
    assert_eq!(err, format!("{} exited with status 3: ldconfig: something broke", path_str(&probes.failing)));
    assert_eq!(fs::read(root.join("etc/ld.so.cache")).expect("cache"), b"an old cache of the image's\n");
    Outcome::Ran
}

fn a_crashing_ldconfig_is_reported_with_its_signal(env: &Env) -> Outcome {
    let probes = needs!(require(env));
    let root = container(env, true);
    let err = rebuild(&root, &probes.crashing, 30.0).expect_err("crashes");
    assert_eq!(err, format!("{} was killed by SIGSEGV: about to crash", path_str(&probes.crashing)));
    Outcome::Ran
}

fn a_hanging_ldconfig_is_killed_at_the_deadline(env: &Env) -> Outcome {
    let probes = needs!(require(env));
    let root = container(env, true);
    let began = Instant::now();
    let err = rebuild(&root, &probes.sleeper, 1.0).expect_err("killed");
    let took = began.elapsed();
    assert_eq!(err, format!("{} did not finish before the deadline and was killed", path_str(&probes.sleeper)));
    assert!(took >= Duration::from_millis(900) && took < Duration::from_secs(5), "{:?}", took);
    assert!(running_ldconfig().is_empty(), "reaped");
    Outcome::Ran
}

/// Processes running a sealed copy (`/memfd:nri-gpu-ldconfig`).
fn running_ldconfig() -> Vec<u32> {
    let mut found = Vec::new();
    for entry in fs::read_dir("/proc").expect("/proc").flatten() {
        let pid = match entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) {
            Some(pid) => pid,
            None => continue,
        };
        if let Ok(exe) = fs::read_link(entry.path().join("exe")) {
            if exe.to_string_lossy().starts_with("/memfd:nri-gpu-ldconfig") {
                found.push(pid);
            }
        }
    }
    found
}

fn status_field(pid: u32, field: &str) -> Vec<String> {
    let text = fs::read_to_string(format!("/proc/{}/status", pid)).expect("status");
    let line = text.lines().find(|l| l.starts_with(field)).unwrap_or_else(|| panic!("no {}", field));
    line[field.len()..].split_whitespace().map(String::from).collect()
}

/// Not in this process's pid, net, IPC, UTS or mount namespace: a sidecar of the
/// same uid in a shared process namespace could otherwise ptrace it. (Seen from
/// here, while a hanging "ldconfig" runs in a thread.)
fn ldconfig_runs_in_namespaces_of_its_own(env: &Env) -> Outcome {
    let probes = needs!(require(env));
    let root = container(env, true);
    let sleeper = probes.sleeper.clone();
    let worker = std::thread::spawn(move || rebuild(&root, &sleeper, 3.0));
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut pids = running_ldconfig();
    while pids.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
        pids = running_ldconfig();
    }
    assert_eq!(pids.len(), 1, "{:?}", pids);
    let pid = pids[0];
    let ours = status_field(std::process::id(), "NSpid:");
    let theirs = status_field(pid, "NSpid:");
    assert_eq!(theirs.len(), ours.len() + 1, "{:?}", theirs);
    assert_eq!(theirs.last().map(String::as_str), Some("1")); // pid 1 of a namespace right below ours
    assert_eq!(status_field(pid, "Uid:"), vec!["65534"; 4]);
    assert_eq!(status_field(pid, "CapBnd:"), vec!["0000000000000000"]);
    // Not dumpable: its /proc files are root's, not nobody's.
    assert_eq!(fs::metadata(format!("/proc/{}/status", pid)).expect("status").uid(), 0);
    for ns in ["pid", "net", "ipc", "uts", "mnt"] {
        let theirs = fs::read_link(format!("/proc/{}/ns/{}", pid, ns)).expect("their ns");
        let mine = fs::read_link(format!("/proc/self/ns/{}", ns)).expect("my ns");
        assert_ne!(theirs, mine, "{}", ns);
    }
    let err = worker.join().expect("the worker thread").expect_err("killed");
    assert!(err.contains("did not finish before the deadline"), "{}", err);
    Outcome::Ran
}

/// The ldconfig process keeps only stdio and what it is told of its
/// descriptors: a child that opens a few lists what is left open above stdio
/// after `close_fds_except` (this process has one thread here: a plain fork).
fn close_fds_except_keeps_exactly_what_it_is_told(_env: &Env) -> Outcome {
    let mut ends: [c_int; 2] = [-1, -1];
    // SAFETY: pipe fills the two ints we pass.
    assert_eq!(unsafe { pipe(ends.as_mut_ptr()) }, 0, "pipe");
    let [read_end, write_end] = ends;
    // SAFETY: a single-threaded process; the child runs the block below and _exits.
    let pid = unsafe { fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        let open = || fs::File::open("/dev/null").expect("/dev/null").into_raw_fd();
        let opened: Vec<c_int> = (0..4).map(|_| open()).collect();
        let keep = [opened[1], opened[3]];
        // SAFETY: descriptors of this child's; the report goes to stdout, which is kept.
        unsafe { dup2(write_end, 1) };
        ldrebuild::close_fds_except(&keep, 1 << 16);
        let listing = format!("/proc/{}/fd", std::process::id());
        let mut left: Vec<c_int> = fs::read_dir("/proc/self/fd")
            .expect("/proc/self/fd")
            .flatten()
            .filter(|entry| fs::read_link(entry.path()).map_or(true, |to| to != Path::new(&listing)))
            .filter_map(|entry| entry.file_name().to_str().and_then(|n| n.parse().ok()))
            .filter(|fd| *fd > 2)
            .collect();
        left.sort_unstable();
        let said = format!("{:?}|{:?}", keep, left);
        // SAFETY: a plain write of our buffer to stdout, then the end of this child.
        unsafe {
            let _ = std::io::Write::write_all(&mut fs::File::from_raw_fd(1), said.as_bytes());
            _exit(0)
        }
    }
    // SAFETY: our copy of the write end, not used again.
    drop(unsafe { fs::File::from_raw_fd(write_end) });
    let mut said = String::new();
    // SAFETY: the read end, ours alone.
    std::io::Read::read_to_string(&mut unsafe { fs::File::from_raw_fd(read_end) }, &mut said).expect("read");
    let mut status: c_int = 0;
    // SAFETY: our own child.
    assert_eq!(unsafe { waitpid(pid, &mut status, 0) }, pid);
    assert_eq!(status, 0, "the child's status");
    let (keep, left) = said.split_once('|').unwrap_or_else(|| panic!("{:?}", said));
    assert_eq!(left, keep, "kept {:?}", said);
    assert!(keep
        .trim_matches(|c| c == '[' || c == ']')
        .split(", ")
        .all(|fd| fd.parse::<c_int>().map_or(false, |fd| fd > 2)));
    Outcome::Ran
}
