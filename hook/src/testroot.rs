//! A fresh directory standing for a container's root in the unit tests,
//! removed at the end (unprivileged: plain openat2 needs no rights).

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::rootdir::RootDir;

pub struct TestRoot(PathBuf);

impl TestRoot {
    pub fn new() -> TestRoot {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let path = std::env::temp_dir().join(format!("nri-gpu-unit-{}-{}", std::process::id(), n));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path).unwrap();
        TestRoot(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// Where the root's `path` (absolute or not) is on the host.
    pub fn at(&self, path: &str) -> PathBuf {
        self.0.join(path.trim_start_matches('/'))
    }

    pub fn root(&self) -> RootDir {
        RootDir::open_path(self.0.to_str().unwrap()).unwrap()
    }

    pub fn dir(&self, path: &str) {
        fs::create_dir_all(self.at(path)).unwrap();
    }

    /// A file holding `data`, its folders made.
    pub fn write(&self, path: &str, data: &[u8]) {
        let file = self.at(path);
        fs::create_dir_all(file.parent().unwrap()).unwrap();
        fs::write(file, data).unwrap();
    }

    pub fn read(&self, path: &str) -> Option<Vec<u8>> {
        fs::read(self.at(path)).ok()
    }

    pub fn link(&self, path: &str, target: &str) {
        std::os::unix::fs::symlink(target, self.at(path)).unwrap();
    }

    pub fn fifo(&self, path: &str) {
        let made = std::process::Command::new("mkfifo").arg(self.at(path)).status().unwrap();
        assert!(made.success());
    }
}

impl Drop for TestRoot {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}
