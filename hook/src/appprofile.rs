//! The `EGLVisibleDGPUDevices` application profile in the container
//! (`engine/start/appprofile.py`): written through the `nodev` copy of the root,
//! its folder made or found on the container's own root file system only, the
//! file replaced atomically; the same text already there is left as it is.

use crate::error::Result;
use crate::rootdir::{write_file, RootDir};

pub const APP_PROFILE_PATH: &str = "/etc/nvidia/nvidia-application-profiles-rc.d/10-container.conf";

/// Write `text` at `APP_PROFILE_PATH`; true when written (not already there).
pub fn write(root: &RootDir, text: &str) -> Result<bool> {
    write_file(root, APP_PROFILE_PATH, text.as_bytes(), 0o644)
}
